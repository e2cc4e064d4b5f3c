-- Lends a busy worker's slot: claims the most urgent ready job of the queues it serves if its
-- priority is at least ARGV[2] (strictly above the priority of the job that lends its slot),
-- with a lease and a fresh fencing token like claim.lua. Promotes nothing: it only looks at
-- the heads of the served `ready` keys, of the queues not paused.
--
-- KEYS[1] jobs (hash)   KEYS[2] state (hash)   KEYS[3] owners (hash)   KEYS[4] leases (zset)
-- KEYS[5] fence (string) KEYS[6] progress (hash) KEYS[7] lateness (hash)
-- KEYS[8] pauses (set: the paused queues, this shard's copy)
-- KEYS[8 + q] ready (zset) of the q-th served queue
-- ARGV[1] worker id  ARGV[2] lowest priority to take  ARGV[3] lease_ms
-- ARGV[3 + q] the q-th served queue's name ("default" for the default queue)
-- Returns {now_ms, priority of the best job left in the served `ready` keys or -1, then the
--          item taken, if any, as claim.lua returns items}
local now = now_ms()
local k = {jobs = KEYS[1], state = KEYS[2], owners = KEYS[3], leases = KEYS[4],
           fence = KEYS[5], progress = KEYS[6]}
local c = {worker = ARGV[1], now = now, lease_ms = tonumber(ARGV[3]), out = {now, -1},
           lateness = {}}
local readies, paused = {}, paused_set(KEYS[8])
for q = 1, #KEYS - 8 do
  if not paused[ARGV[3 + q]] then readies[#readies + 1] = KEYS[8 + q] end
end
local best_key, best_id, best_score = nil, nil, ready_score(tonumber(ARGV[2]) - 1, 0)
for _, key in ipairs(readies) do
  local head = redis.call('ZRANGE', key, '0', '0', 'WITHSCORES')
  if head[2] and tonumber(head[2]) < best_score then
    best_key, best_id, best_score = key, head[1], tonumber(head[2])
  end
end
if best_key then
  redis.call('ZREM', best_key, best_id)
  take_all(k, c, {best_id}, redis.call('HMGET', KEYS[1], best_id),
           {parse_state(redis.call('HGET', KEYS[2], best_id))})
  record_lateness(KEYS[7], now, c.lateness)
end
for _, key in ipairs(readies) do c.out[2] = math.max(c.out[2], ready_priority(key)) end
return c.out
