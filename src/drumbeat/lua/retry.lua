-- Schedules failed jobs for another attempt after their backoff. Fenced like complete.lua.
--
-- KEYS[1] leases (zset)  KEYS[2] owners (hash)  KEYS[3] due (zset)  KEYS[4] wake (zset)
-- ARGV    groups of 3, one per job: id, token, delay_ms
-- Returns one integer per job: 1 scheduled, 0 refused (lease lost)
local now = now_ms()
local out = {}
for i = 0, #ARGV / 3 - 1 do
  local id, token, delay_ms = ARGV[i * 3 + 1], ARGV[i * 3 + 2], tonumber(ARGV[i * 3 + 3])
  if owns(KEYS[2], id, token) then
    redis.call('HDEL', KEYS[2], id)
    redis.call('ZREM', KEYS[1], id)
    redis.call('ZADD', KEYS[3], now + delay_ms, id)
    wake_if_head(KEYS[3], KEYS[4], id)
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
