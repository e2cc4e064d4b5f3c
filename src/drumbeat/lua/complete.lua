-- Acks finished jobs: drops lease, record and dedup key, and stores each outcome for its TTL.
-- A job whose fencing token no longer matches (its lease was taken over) is left untouched.
--
-- KEYS[1] leases (zset)  KEYS[2] owners (hash)  KEYS[3] jobs (hash)   KEYS[4] state (hash)
-- KEYS[5] uniq (hash)    KEYS[6] results (hash) KEYS[7] expires (zset)
-- KEYS[7+i] done:<id> (list) of the i-th job
-- ARGV    pairs, one per job: "<id>|<token>|<ttl_ms>" (ttl 0 stores nothing), outcome
--         (packed: every argument costs the client an encoding step)
-- Returns one integer per job: 1 acked, 0 refused (lease lost)
local now = now_ms()
local out = {}
for i = 0, #ARGV / 2 - 1 do
  local id, token, ttl = string.match(ARGV[i * 2 + 1], '^([^|]+)|(%d+)|(%d+)$')
  local outcome, ttl_ms = ARGV[i * 2 + 2], tonumber(ttl)
  if id and owns(KEYS[2], id, token) then
    local s = parse_state(redis.call('HGET', KEYS[4], id))
    release_key(KEYS[5], id, s.key)
    redis.call('HDEL', KEYS[2], id)
    redis.call('ZREM', KEYS[1], id)
    redis.call('HDEL', KEYS[3], id)
    redis.call('HDEL', KEYS[4], id)
    if ttl_ms > 0 then
      redis.call('HSET', KEYS[6], id, outcome)
      redis.call('ZADD', KEYS[7], now + ttl_ms, id)
      local done = KEYS[8 + i]
      redis.call('RPUSH', done, 1)
      redis.call('PEXPIRE', done, ttl_ms)
    end
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
