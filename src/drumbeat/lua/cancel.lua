-- Cancels a job. One waiting in `ready` or `due`, or parked on a limiter key (a state in no
-- queue, no lease, not dead: release_limits.lua drops an entry whose job has no state), is
-- removed at once and its outcome recorded as cancelled (announced to `Job.result` waiters). One running is marked in `cancels` and its
-- worker told on the shard's signals channel: the run stops at its next checkpoint (an async
-- task at once), and its outcome is recorded then; it is never retried.
--
-- KEYS[1] ready (zset)    KEYS[2] due (zset)      KEYS[3] leases (zset)  KEYS[4] jobs (hash)
-- KEYS[5] state (hash)    KEYS[6] uniq (hash)     KEYS[7] results (hash) KEYS[8] expires (zset)
-- KEYS[9] waiting (zset)  KEYS[10] cancels (hash) KEYS[11] progress (hash)
-- KEYS[12] signals (pub/sub channel)  KEYS[13] done:<id> (list)  KEYS[14] dead (zset)
-- KEYS[15] parking (hash: a parked job cancelled is counted off its queue's parked jobs)
-- KEYS[14 + 2q] ready (zset), KEYS[15 + 2q] due (zset) of the q-th other queue (KEYS[1] and
--          KEYS[2] are the default queue's)
-- KEYS[15 + 2q + 1..] the workflow keys (_workflows.lua: workflow_keys), with the ready and
--          wake keys of the default queue and each other queue: a job waiting for its
--          dependencies (`deps`) is cancelled at once too, and the dependents of a job
--          cancelled here are dead-lettered (or released, where they allow it), and a batch
--          member cancelled here counted, in this call
-- ARGV[1] job id  ARGV[2] outcome ttl ms  ARGV[2 + q] the q-th other queue's name
-- Returns 1 cancelled (it was waiting), 2 cancel requested (it is running), 0 nothing to
--         cancel (finished, dead, a schedule's run, or unknown)
local id = ARGV[1]
if run_schedule_id(id) then return 0 end
local names, ready, due = {'default'}, KEYS[1], KEYS[2]
for q = 1, #ARGV - 2 do names[q + 1] = ARGV[2 + q] end
local w = workflow_keys(15 + 2 * (#names - 1), names, tonumber(ARGV[2]))
local raw = redis.call('HGET', KEYS[5], id)
local q = queue_index(names, parse_state(raw).queue)
if q and q > 1 then ready, due = KEYS[14 + 2 * (q - 1)], KEYS[15 + 2 * (q - 1)] end
local leased = redis.call('ZSCORE', KEYS[3], id)
local waits = raw and (redis.call('HDEL', w.deps, id) == 1 or redis.call('ZREM', w.freed, id) == 1)
local parked = raw and q and not waits and not leased and not redis.call('ZSCORE', KEYS[14], id)
  and not redis.call('ZSCORE', ready, id) and not redis.call('ZSCORE', due, id)
if waits or (q and (parked or redis.call('ZREM', ready, id) == 1
                    or redis.call('ZREM', due, id) == 1)) then
  if parked then count_parking(KEYS[15], PARKED_FIELD, names[q], -1) end
  local ttl_ms, now = tonumber(ARGV[2]), now_ms()
  local k = {uniq = KEYS[6], jobs = KEYS[4], state = KEYS[5], progress = KEYS[11],
             results = KEYS[7], expires = KEYS[8]}
  end_cancelled(k, id, parse_state(redis.call('HGET', KEYS[5], id)), now, ttl_ms)
  if ttl_ms > 0 and redis.call('ZREM', KEYS[9], id) == 1 then announce(KEYS[13], 0, ttl_ms) end
  settle_ended(w, {id}, DEP_CANCELLED, now)
  return 1
end
if leased then
  redis.call('HSET', KEYS[10], id, now_ms())
  redis.call('PUBLISH', KEYS[12], 'c' .. id)
  return 2
end
return 0
