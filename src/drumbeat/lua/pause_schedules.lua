-- Pauses schedules: no new runs until resumed. A run already claimed finishes; a run promoted
-- but not yet claimed is withdrawn, from whichever queue's `ready` holds it.
--
-- KEYS[1] ready (zset)  KEYS[2] state (hash)  KEYS[3] jobs (hash)
-- KEYS[3 + r] ready (zset) of the r-th queue other than the default one
-- KEYS[2 + n + 2i] wheel:<b> (zset), KEYS[3 + n + 2i] schedules:<b> (hash) of the i-th schedule
-- ARGV[1] number of other queues (n), then the schedule ids
-- Returns the number of schedules that were running and are now paused.
local nr = tonumber(ARGV[1])
local readies = {KEYS[1]}
for r = 1, nr do readies[r + 1] = KEYS[3 + r] end
local n = 0
for i = 1, #ARGV - 1 do
  local id = ARGV[1 + i]
  local schedules_key = KEYS[3 + nr + 2 * i]
  local s = parse_schedule(redis.call('HGET', schedules_key, id))
  if s and not s.paused then
    s.paused = true
    redis.call('HSET', schedules_key, id, format_schedule(s))
    redis.call('ZREM', KEYS[2 + nr + 2 * i], id)
    withdraw_run(KEYS[2], KEYS[3], readies, RUN_PREFIX .. id)
    n = n + 1
  end
end
return n
