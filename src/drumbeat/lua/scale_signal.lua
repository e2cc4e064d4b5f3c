-- Reads what the autoscaler sizes worker pools on, in one read-only call: the backlog per
-- priority, what is due but not yet promoted (schedule lag), the busy slots, the lateness ring,
-- and (on the namespace's main shard) the live workers and supervisors.
--
-- KEYS[1] ready (zset)  KEYS[2] due (zset)  KEYS[3] leases (zset)  KEYS[4] lateness (hash)
-- KEYS[5] workers (zset)  KEYS[6] workerinfo (hash)  KEYS[7] supervisors (zset)
-- KEYS[8] supervisorinfo (hash)
-- ARGV[1] worker ttl ms  ARGV[2] 1: read the registrations too
-- Returns {now ms, {ready count at priority 0, ..., at priority 9}, entries of `due` at or
--          before now, the earliest `due` score or -1, leases held, {lateness, flat HGETALL},
--          {worker id, info, ...} of workers beating within the ttl,
--          {supervisor id, expiry ms, info, ...} of supervisors whose registration holds}
local now = now_ms()
local counts = {}
for p = 0, MAX_PRIORITY do
  local base = ready_score(p, 0)
  counts[p + 1] = redis.call('ZCOUNT', KEYS[1], string.format('%.0f', base),
    '(' .. string.format('%.0f', base + PRIORITY_SPAN))
end
local due_now = redis.call('ZCOUNT', KEYS[2], '-inf', now)
local head = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
local earliest = -1
if head[2] then earliest = tonumber(head[2]) end
local busy = redis.call('ZCARD', KEYS[3])
local lateness = redis.call('HGETALL', KEYS[4])
local workers, supervisors = {}, {}
if ARGV[2] == '1' then
  local ids = redis.call('ZRANGEBYSCORE', KEYS[5], now - tonumber(ARGV[1]), '+inf')
  for _, id in ipairs(ids) do
    workers[#workers + 1] = id
    workers[#workers + 1] = redis.call('HGET', KEYS[6], id) or ''
  end
  local sups = redis.call('ZRANGEBYSCORE', KEYS[7], now, '+inf', 'WITHSCORES')
  for i = 1, #sups, 2 do
    supervisors[#supervisors + 1] = sups[i]
    supervisors[#supervisors + 1] = sups[i + 1]
    supervisors[#supervisors + 1] = redis.call('HGET', KEYS[8], sups[i]) or ''
  end
end
return {now, counts, due_now, earliest, busy, lateness, workers, supervisors}
