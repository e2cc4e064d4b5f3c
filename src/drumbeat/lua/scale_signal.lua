-- Reads what the autoscaler sizes worker pools on, in one read-only call: the backlog per
-- priority, what is due but not yet promoted (schedule lag), the busy slots, the lateness ring,
-- and (on the namespace's main shard) the live workers and supervisors.
--
-- KEYS[1] leases (zset)  KEYS[2] lateness (hash)  KEYS[3] workers (zset)
-- KEYS[4] workerinfo (hash)  KEYS[5] supervisors (zset)  KEYS[6] supervisorinfo (hash)
-- KEYS[7..] ready (zset), due (zset) of each queue counted, in pairs
-- ARGV[1] worker ttl ms  ARGV[2] 1: read the registrations too
-- Returns {now ms, {ready count at priority 0, ..., at priority 9}, entries of `due` at or
--          before now, the earliest `due` score or -1, leases held, {lateness, flat HGETALL},
--          {worker id, info, ...} of workers beating within the ttl,
--          {supervisor id, expiry ms, info, ...} of supervisors whose registration holds}
-- (ready and due summed over the queues)
local now = now_ms()
local counts = {}
for p = 0, MAX_PRIORITY do counts[p + 1] = 0 end
local due_now, earliest = 0, -1
for q = 7, #KEYS, 2 do
  for p = 0, MAX_PRIORITY do
    local base = ready_score(p, 0)
    counts[p + 1] = counts[p + 1] + redis.call('ZCOUNT', KEYS[q], string.format('%.0f', base),
      '(' .. string.format('%.0f', base + PRIORITY_SPAN))
  end
  due_now = due_now + redis.call('ZCOUNT', KEYS[q + 1], '-inf', now)
  local head = redis.call('ZRANGE', KEYS[q + 1], 0, 0, 'WITHSCORES')
  if head[2] and (earliest < 0 or tonumber(head[2]) < earliest) then
    earliest = tonumber(head[2])
  end
end
local busy = redis.call('ZCARD', KEYS[1])
local lateness = redis.call('HGETALL', KEYS[2])
local workers, supervisors = {}, {}
if ARGV[2] == '1' then
  local ids = redis.call('ZRANGEBYSCORE', KEYS[3], now - tonumber(ARGV[1]), '+inf')
  for _, id in ipairs(ids) do
    workers[#workers + 1] = id
    workers[#workers + 1] = redis.call('HGET', KEYS[4], id) or ''
  end
  local sups = redis.call('ZRANGEBYSCORE', KEYS[5], now, '+inf', 'WITHSCORES')
  for i = 1, #sups, 2 do
    supervisors[#supervisors + 1] = sups[i]
    supervisors[#supervisors + 1] = sups[i + 1]
    supervisors[#supervisors + 1] = redis.call('HGET', KEYS[6], sups[i]) or ''
  end
end
return {now, counts, due_now, earliest, busy, lateness, workers, supervisors}
