-- Lends a busy worker's slot: claims the most urgent ready job if its priority is at least
-- ARGV[2] (strictly above the priority of the job that lends its slot), with a lease and a
-- fresh fencing token like claim.lua. Promotes nothing and opens no schedule bucket: it only
-- looks at the head of `ready`.
--
-- KEYS[1] ready (zset)  KEYS[2] jobs (hash)   KEYS[3] state (hash)    KEYS[4] owners (hash)
-- KEYS[5] leases (zset) KEYS[6] fence (string) KEYS[7] progress (hash) KEYS[8] lateness (hash)
-- ARGV[1] worker id  ARGV[2] lowest priority to take  ARGV[3] lease_ms
-- Returns {now_ms, priority of the best job left in `ready` or -1, then the item taken, if
--          any, as claim.lua returns items}
local now = now_ms()
local k = {ready = KEYS[1], jobs = KEYS[2], state = KEYS[3], owners = KEYS[4], leases = KEYS[5],
           fence = KEYS[6], progress = KEYS[7]}
local c = {worker = ARGV[1], now = now, lease_ms = tonumber(ARGV[3]), out = {now, -1},
           lateness = {}}
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if head[2] and tonumber(head[2]) < ready_score(tonumber(ARGV[2]) - 1, 0) then
  redis.call('ZREM', KEYS[1], head[1])
  local ids = {head[1]}
  take_all(k, c, ids, redis.call('HMGET', KEYS[2], head[1]),
           {parse_state(redis.call('HGET', KEYS[3], head[1]))})
  record_lateness(KEYS[8], now, c.lateness)
end
c.out[2] = ready_priority(KEYS[1])
return c.out
