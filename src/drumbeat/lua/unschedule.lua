-- Removes schedules. A run already claimed finishes, and its completion finds no definition,
-- so it does not run again; a run promoted but not yet claimed is withdrawn, from whichever
-- queue's `ready` holds it. A bucket's marker may now be early, which is harmless (promoting
-- re-scores it).
--
-- KEYS[1] ready (zset)  KEYS[2] state (hash)  KEYS[3] jobs (hash)  KEYS[4] faults (hash)
-- KEYS[4 + r] ready (zset) of the r-th queue other than the default one
-- KEYS[3 + n + 2i] wheel:<b> (zset), KEYS[4 + n + 2i] schedules:<b> (hash) of the i-th schedule
-- ARGV[1] number of other queues (n), then the schedule ids
-- Returns the number of schedules removed.
local nr = tonumber(ARGV[1])
local readies = {KEYS[1]}
for r = 1, nr do readies[r + 1] = KEYS[4 + r] end
local n = 0
for i = 1, #ARGV - 1 do
  local id, member = ARGV[1 + i], RUN_PREFIX .. ARGV[1 + i]
  n = n + redis.call('HDEL', KEYS[4 + nr + 2 * i], id)
  redis.call('ZREM', KEYS[3 + nr + 2 * i], id)
  redis.call('HDEL', KEYS[4], id)
  withdraw_run(KEYS[2], KEYS[3], readies, member)
end
return n
