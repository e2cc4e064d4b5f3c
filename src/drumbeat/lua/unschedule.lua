-- Removes schedules. A run already claimed finishes, and its completion finds no definition,
-- so it does not run again; a run promoted but not yet claimed is withdrawn. A bucket's marker
-- may now be early, which is harmless (promoting re-scores it).
--
-- KEYS[1] ready (zset)  KEYS[2] state (hash)  KEYS[3] jobs (hash)  KEYS[4] faults (hash)
-- KEYS[3 + 2i] wheel:<b> (zset), KEYS[4 + 2i] schedules:<b> (hash) of the i-th schedule
-- ARGV    schedule ids
-- Returns the number of schedules removed.
local n = 0
for i, id in ipairs(ARGV) do
  local member = RUN_PREFIX .. id
  n = n + redis.call('HDEL', KEYS[4 + 2 * i], id)
  redis.call('ZREM', KEYS[3 + 2 * i], id)
  redis.call('HDEL', KEYS[4], id)
  if redis.call('ZREM', KEYS[1], member) == 1 then
    redis.call('HDEL', KEYS[2], member)
    redis.call('HDEL', KEYS[3], member)
  end
end
return n
