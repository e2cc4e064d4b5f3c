-- Requeues dead-lettered jobs with a fresh set of attempts (`drumbeat dead retry`), each in its
-- queue, and brings back the dependents they dead-lettered (their orphans, _workflows.lua:
-- adopt_orphans) to wait for them again. A batch member among them (jobs or dependents) that
-- its batch counted as failed is a member again, pending, unless the batch ended or was
-- cancelled: then it runs outside it (_workflows.lua: rejoin_batch).
--
-- KEYS[1] dead (zset)  KEYS[2] errors (hash)  KEYS[3] state (hash)  KEYS[4] ready (zset)
-- KEYS[5] results (hash) KEYS[6] expires (zset) KEYS[7] seq (string) KEYS[8] wake (zset)
-- KEYS[9] uniq (hash)  KEYS[10] jobs (hash)
-- KEYS[10+i] done:<id> (list) of the i-th job: its old announcement must go, or a waiter would
--          read "finished" from it again and again while the job is queued
-- KEYS[10 + n + 2q - 1] ready (zset), KEYS[10 + n + 2q] wake (zset) of the q-th other queue
--          (n ids; KEYS[4] and KEYS[8] are the default queue's)
-- KEYS[10 + n + 2m + 1 ..] the workflow keys (_workflows.lua: workflow_keys; m other queues),
--          with the ready and wake keys of the default queue and the m others
-- ARGV[1] n   ARGV[1 + i] the i-th job id   ARGV[1 + n + q] the q-th other queue's name
-- Returns {requeued, back, alone}: the number of jobs requeued (ids not in the dead set,
-- without a record, or of a queue not given, are skipped), of dependents brought back to wait
-- (not among the requeued), and of those two that were members of a batch that ended: they
-- run outside it.
local n_ids = tonumber(ARGV[1])
local names, readies, wakes, woken = {'default'}, {KEYS[4]}, {KEYS[8]}, {}
for q = 1, #ARGV - 1 - n_ids do
  names[q + 1] = ARGV[1 + n_ids + q]
  readies[q + 1], wakes[q + 1] = KEYS[10 + n_ids + 2 * q - 1], KEYS[10 + n_ids + 2 * q]
end
local w = workflow_keys(10 + n_ids + 2 * (#names - 1), names, 0)
-- Orphans last: a dependent retried with the dependency that dead-lettered it comes back to
-- wait for it (with that one), rather than to run at once.
local order = {}
for i = 1, n_ids do
  if not redis.call('HGET', w.orphans, ARGV[1 + i]) then order[#order + 1] = i end
end
for i = 1, n_ids do
  if redis.call('HGET', w.orphans, ARGV[1 + i]) then order[#order + 1] = i end
end
local n, back, alone = 0, 0, 0
for _, i in ipairs(order) do
  local id = ARGV[1 + i]
  local s = parse_state(redis.call('HGET', KEYS[3], id))
  local q = queue_index(names, s.queue)
  if q and redis.call('ZSCORE', KEYS[1], id) and redis.call('HEXISTS', KEYS[10], id) == 1 then
    s.attempt, s.stalls, s.unknown, s.seq = 0, 0, 0, redis.call('INCR', KEYS[7])
    if s.key ~= '' and redis.call('HSETNX', KEYS[9], s.key, id) == 0 then s.key = '' end
    redis.call('HSET', KEYS[3], id, format_state(s))
    redis.call('ZREM', KEYS[1], id)
    redis.call('HDEL', KEYS[2], id)
    redis.call('HDEL', KEYS[5], id)
    redis.call('ZREM', KEYS[6], id)
    redis.call('DEL', KEYS[10 + i])
    redis.call('ZADD', readies[q], ready_score(s.priority, s.seq), id)
    woken[q] = true
    n = n + 1
    if rejoin_batch(w, id) < 0 then alone = alone + 1 end
    local b, a = adopt_orphans(w, id)
    back, alone = back + b, alone + a
  end
end
for q in pairs(woken) do wake(wakes[q]) end
return {n, back, alone}
