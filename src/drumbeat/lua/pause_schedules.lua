-- Pauses schedules: no new runs until resumed. A run already claimed finishes; a run promoted
-- but not yet claimed is withdrawn.
--
-- KEYS[1] ready (zset)  KEYS[2] state (hash)  KEYS[3] jobs (hash)
-- KEYS[2 + 2i] wheel:<b> (zset), KEYS[3 + 2i] schedules:<b> (hash) of the i-th schedule
-- ARGV    schedule ids
-- Returns the number of schedules that were running and are now paused.
local n = 0
for i, id in ipairs(ARGV) do
  local schedules_key = KEYS[3 + 2 * i]
  local s = parse_schedule(redis.call('HGET', schedules_key, id))
  if s and not s.paused then
    local member = RUN_PREFIX .. id
    s.paused = true
    redis.call('HSET', schedules_key, id, format_schedule(s))
    redis.call('ZREM', KEYS[2 + 2 * i], id)
    if redis.call('ZREM', KEYS[1], member) == 1 then
      redis.call('HDEL', KEYS[2], member)
      redis.call('HDEL', KEYS[3], member)
    end
    n = n + 1
  end
end
return n
