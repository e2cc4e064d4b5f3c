-- Requeues dead-lettered jobs with a fresh set of attempts (`drumbeat dead retry`).
--
-- KEYS[1] dead (zset)  KEYS[2] errors (hash)  KEYS[3] state (hash)  KEYS[4] ready (zset)
-- KEYS[5] results (hash) KEYS[6] expires (zset) KEYS[7] seq (string) KEYS[8] wake (zset)
-- KEYS[9] uniq (hash)  KEYS[10] jobs (hash)
-- KEYS[10+i] done:<id> (list) of the i-th job: its old announcement must go, or a waiter would
--          read "finished" from it again and again while the job is queued
-- ARGV    job ids
-- Returns the number of jobs requeued (ids not in the dead set, or without a record, are skipped).
local n = 0
for i, id in ipairs(ARGV) do
  if redis.call('ZSCORE', KEYS[1], id) and redis.call('HEXISTS', KEYS[10], id) == 1 then
    local s = parse_state(redis.call('HGET', KEYS[3], id))
    s.attempt, s.stalls, s.seq = 0, 0, redis.call('INCR', KEYS[7])
    if s.key ~= '' and redis.call('HSETNX', KEYS[9], s.key, id) == 0 then s.key = '' end
    redis.call('HSET', KEYS[3], id, format_state(s))
    redis.call('ZREM', KEYS[1], id)
    redis.call('HDEL', KEYS[2], id)
    redis.call('HDEL', KEYS[5], id)
    redis.call('ZREM', KEYS[6], id)
    redis.call('DEL', KEYS[10 + i])
    redis.call('ZADD', KEYS[4], ready_score(s.priority, s.seq), id)
    n = n + 1
  end
end
if n > 0 then wake(KEYS[8]) end
return n
