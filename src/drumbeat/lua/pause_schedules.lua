-- Pauses schedules: no new runs until resumed. A run already claimed finishes; a run promoted
-- but not yet claimed is withdrawn.
--
-- KEYS[1] schedules (hash)  KEYS[2] due (zset)  KEYS[3] ready (zset)  KEYS[4] state (hash)
-- ARGV    schedule ids
-- Returns the number of schedules that were running and are now paused.
local n = 0
for _, id in ipairs(ARGV) do
  local s = parse_schedule(redis.call('HGET', KEYS[1], id))
  if s and not s.paused then
    local member = RUN_PREFIX .. id
    s.paused = true
    redis.call('HSET', KEYS[1], id, format_schedule(s))
    redis.call('ZREM', KEYS[2], member)
    if redis.call('ZREM', KEYS[3], member) == 1 then redis.call('HDEL', KEYS[4], member) end
    n = n + 1
  end
end
return n
