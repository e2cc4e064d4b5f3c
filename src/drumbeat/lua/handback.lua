-- Returns claimed jobs to the front of their priority level at once (graceful shutdown), without
-- spending an attempt. Fenced like complete.lua.
--
-- KEYS[1] leases (zset)  KEYS[2] owners (hash)  KEYS[3] state (hash)  KEYS[4] ready (zset)
-- KEYS[5] wake (zset)
-- ARGV    id, token pairs
-- Returns the number of jobs handed back.
local n = 0
for i = 1, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  if owns(KEYS[2], id, token) then
    local s = parse_state(redis.call('HGET', KEYS[3], id))
    if s.attempt > 0 then s.attempt = s.attempt - 1 end
    redis.call('HSET', KEYS[3], id, format_state(s))
    redis.call('HDEL', KEYS[2], id)
    redis.call('ZREM', KEYS[1], id)
    redis.call('ZADD', KEYS[4], ready_score(s.priority, s.seq), id)
    n = n + 1
  end
end
if n > 0 then wake(KEYS[5]) end
return n
