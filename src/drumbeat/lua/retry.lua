-- Schedules failed jobs of one queue for another attempt after their backoff. Fenced like
-- complete.lua.
--
-- KEYS[1] leases (zset)  KEYS[2] owners (hash)  KEYS[3] due (zset)  KEYS[4] wake (zset)
-- KEYS[5] signals (pub/sub channel)   (due and wake: the jobs' queue)
-- ARGV    groups of 4, one per job: id, token, delay_ms, priority
-- Returns one integer per job: 1 scheduled, 0 refused (lease lost)
local now = now_ms()
local out = {}
for i = 0, #ARGV / 4 - 1 do
  local id, token, delay_ms = ARGV[i * 4 + 1], ARGV[i * 4 + 2], tonumber(ARGV[i * 4 + 3])
  if owns(KEYS[2], id, token) then
    redis.call('HDEL', KEYS[2], id)
    redis.call('ZREM', KEYS[1], id)
    redis.call('ZADD', KEYS[3], now + delay_ms, id)
    -- As in enqueue.lua: busy workers whose jobs checkpoint promote an urgent retry when due.
    if wake_if_head(KEYS[3], KEYS[4], id) and tonumber(ARGV[i * 4 + 4]) > 0 then
      redis.call('PUBLISH', KEYS[5], 'd' .. (now + delay_ms))
    end
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
