-- Removes schedules. A run already claimed finishes, and its completion finds no definition,
-- so it does not run again; a run promoted but not yet claimed is withdrawn.
--
-- KEYS[1] schedules (hash)  KEYS[2] due (zset)  KEYS[3] ready (zset)  KEYS[4] state (hash)
-- KEYS[5] faults (hash)
-- ARGV    schedule ids
-- Returns the number of schedules removed.
local n = 0
for _, id in ipairs(ARGV) do
  local member = RUN_PREFIX .. id
  n = n + redis.call('HDEL', KEYS[1], id)
  redis.call('HDEL', KEYS[5], id)
  redis.call('ZREM', KEYS[2], member)
  if redis.call('ZREM', KEYS[3], member) == 1 then redis.call('HDEL', KEYS[4], member) end
end
return n
