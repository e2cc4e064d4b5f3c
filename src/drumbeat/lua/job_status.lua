-- Reads where one job is, atomically (a job moving between sets is never seen in none). With a
-- wait, a job not yet finished is marked as waited for until then, so that complete.lua and
-- bury.lua announce its outcome on `done:<id>` (they skip the list for jobs nobody waits for).
--
-- KEYS[1] ready (zset)  KEYS[2] due (zset)  KEYS[3] leases (zset)  KEYS[4] dead (zset)
-- KEYS[5] results (hash) KEYS[6] state (hash) KEYS[7] waiting (zset)
-- KEYS[6 + 2q] ready (zset), KEYS[7 + 2q] due (zset) of the q-th other queue (KEYS[1] and
--          KEYS[2] are the default queue's)
-- KEYS[7 + 2q + 1] deps (hash: jobs waiting for their dependencies)
-- ARGV[1] job id  ARGV[2] ms the caller will wait for it (0: none)
-- ARGV[2 + q] the q-th other queue's name (a job of a queue not named reads as queued while
--          it waits, delayed or not)
-- Returns {status, outcome or false, state or false}; status is one of queued, scheduled,
--         running, dead, finished, missing, waiting (for its dependencies)
local id = ARGV[1]
local outcome = redis.call('HGET', KEYS[5], id)
local state = redis.call('HGET', KEYS[6], id)
local status = 'missing'
local ready, due = KEYS[1], KEYS[2]
if state and #ARGV > 2 then
  local names = {'default'}
  for q = 1, #ARGV - 2 do names[q + 1] = ARGV[2 + q] end
  local q = queue_index(names, parse_state(state).queue)
  if q and q > 1 then ready, due = KEYS[6 + 2 * (q - 1)], KEYS[7 + 2 * (q - 1)] end
end
if redis.call('ZSCORE', KEYS[3], id) then status = 'running'
elseif redis.call('ZSCORE', ready, id) then status = 'queued'
elseif redis.call('ZSCORE', due, id) then status = 'scheduled'
elseif redis.call('ZSCORE', KEYS[4], id) then status = 'dead'
elseif outcome then status = 'finished'
elseif state and redis.call('HEXISTS', KEYS[8 + 2 * (#ARGV - 2)], id) == 1 then status = 'waiting'
-- A job of a queue the caller did not name waits in that queue's `ready` or `due`; a job with
-- a state in none of these is parked on a limiter key (`parked:<key>`): it waits too.
elseif state then status = 'queued'
end
local wait_ms = tonumber(ARGV[2]) or 0
if wait_ms > 0 and (status == 'running' or status == 'queued' or status == 'scheduled'
                    or status == 'waiting') then
  redis.call('ZADD', KEYS[7], 'GT', now_ms() + wait_ms, id)
end
return {status, outcome, state}
