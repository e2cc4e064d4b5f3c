-- Moves jobs that failed for good to the dead-letter set, keeping their record (and saved
-- progress) for a retry,
-- and stores the failure as their outcome so `Job.result` raises it (announced on `done` to
-- those waiting, see job_status.lua). Fenced like complete.lua.
--
-- KEYS[1] leases (zset)  KEYS[2] owners (hash)  KEYS[3] state (hash)   KEYS[4] uniq (hash)
-- KEYS[5] dead (zset)    KEYS[6] errors (hash)  KEYS[7] results (hash) KEYS[8] expires (zset)
-- KEYS[9] waiting (zset) KEYS[10] cancels (hash) KEYS[10+i] done:<id> (list) of the i-th job
-- KEYS[10+n+1..] the workflow keys (_workflows.lua: workflow_keys): the jobs' dependents are
--         dead-lettered (or released, where they allow the failure), and the ends of batch
--         members counted, in this call
-- ARGV[1] outcome ttl ms of dependents dead-lettered here  ARGV[2] q: how many queues' keys
--         the workflow keys hold  ARGV[2 + 1..q] their names (the default one first)
-- ARGV    then groups of 4, one per job: id, token, error record, ttl_ms of the outcome
-- Returns one integer per job: 1 buried, 0 refused (lease lost)
local now = now_ms()
local nq = tonumber(ARGV[2])
local at = 2 + nq
local n = (#ARGV - at) / 4
local out, buried = {}, {}
for i = 0, n - 1 do
  local id, token, err = ARGV[at + i * 4 + 1], ARGV[at + i * 4 + 2], ARGV[at + i * 4 + 3]
  local ttl_ms = tonumber(ARGV[at + i * 4 + 4])
  if owns(KEYS[2], id, token) then
    local s = parse_state(redis.call('HGET', KEYS[3], id))
    release_key(KEYS[4], id, s.key)
    redis.call('HDEL', KEYS[2], id)
    redis.call('HDEL', KEYS[10], id)
    redis.call('ZREM', KEYS[1], id)
    redis.call('ZADD', KEYS[5], now, id)
    redis.call('HSET', KEYS[6], id, err)
    if ttl_ms > 0 then
      redis.call('HSET', KEYS[7], id, err)
      redis.call('ZADD', KEYS[8], now + ttl_ms, id)
      if redis.call('ZREM', KEYS[9], id) == 1 then announce(KEYS[11 + i], 0, ttl_ms) end
    end
    buried[#buried + 1] = id
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
if #buried > 0 then
  local w = workflow_keys(10 + n, {unpack(ARGV, 3, 2 + nq)}, tonumber(ARGV[1]))
  settle_ended(w, buried, DEP_FAILED, now)
end
return out
