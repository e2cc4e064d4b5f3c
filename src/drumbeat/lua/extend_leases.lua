-- Renews the leases a worker still owns and records its heartbeat, in one call.
--
-- KEYS[1] leases (zset)  KEYS[2] owners (hash)  KEYS[3] workers (zset)  KEYS[4] workerinfo (hash)
-- KEYS[5] cancels (hash)
-- ARGV[1] worker id  ARGV[2] lease_ms  ARGV[3] worker info (opaque)  ARGV[4..] id, token pairs
-- Returns {{id, token of each claim this worker no longer owns (taken over or finished
--          elsewhere), flat: the token tells two claims of one job apart}, {ids of owned jobs
--          whose cancel was requested (in case the signal was missed)}}
local now = now_ms()
redis.call('ZADD', KEYS[3], now, ARGV[1])
redis.call('HSET', KEYS[4], ARGV[1], ARGV[3])
local deadline = now + tonumber(ARGV[2])
local lost, owned = {}, {}
for i = 4, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  if owns(KEYS[2], id, token) then
    redis.call('ZADD', KEYS[1], deadline, id)
    owned[#owned + 1] = id
  else
    lost[#lost + 1] = id
    lost[#lost + 1] = token
  end
end
local cancelled = {}
if #owned > 0 then
  local asked = redis.call('HMGET', KEYS[5], unpack(owned))
  for i, id in ipairs(owned) do
    if asked[i] then cancelled[#cancelled + 1] = id end
  end
end
return {lost, cancelled}
