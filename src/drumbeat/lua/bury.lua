-- Moves jobs that failed for good to the dead-letter set, keeping their record (and saved
-- progress) for a retry,
-- and stores the failure as their outcome so `Job.result` raises it (announced on `done` to
-- those waiting, see job_status.lua). Fenced like complete.lua.
--
-- KEYS[1] leases (zset)  KEYS[2] owners (hash)  KEYS[3] state (hash)   KEYS[4] uniq (hash)
-- KEYS[5] dead (zset)    KEYS[6] errors (hash)  KEYS[7] results (hash) KEYS[8] expires (zset)
-- KEYS[9] waiting (zset) KEYS[10] cancels (hash) KEYS[10+i] done:<id> (list) of the i-th job
-- ARGV    groups of 4, one per job: id, token, error record, ttl_ms of the outcome
-- Returns one integer per job: 1 buried, 0 refused (lease lost)
local now = now_ms()
local out = {}
for i = 0, #ARGV / 4 - 1 do
  local id, token, err = ARGV[i * 4 + 1], ARGV[i * 4 + 2], ARGV[i * 4 + 3]
  local ttl_ms = tonumber(ARGV[i * 4 + 4])
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
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
