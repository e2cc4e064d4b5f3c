-- Acks finished jobs: drops lease, record, saved progress, cancel request and dedup key, and
-- stores each outcome for its TTL (a cancelled job's outcome too: it is settled here).
-- A job whose fencing token no longer matches (its lease was taken over) is left untouched.
-- A job someone waits for (`waiting`, see job_status.lua) is announced on its `done` list.
--
-- KEYS[1] leases (zset)  KEYS[2] owners (hash)  KEYS[3] jobs (hash)   KEYS[4] state (hash)
-- KEYS[5] uniq (hash)    KEYS[6] results (hash) KEYS[7] expires (zset) KEYS[8] waiting (zset)
-- KEYS[9] progress (hash) KEYS[10] cancels (hash)
-- KEYS[10+i] done:<id> (list) of the i-th job
-- ARGV    pairs, one per job: "<id>|<token>|<ttl_ms>|<dedupkey>" (ttl 0 stores nothing; the
--         dedup key as the claim handed it out, often empty), outcome
--         (packed: every argument costs the client an encoding step)
-- Returns one integer per job: 1 acked, 0 refused (lease lost)
local now = now_ms()
local n = #ARGV / 2
local out = {}
if n < 1 then return out end
local ids, tokens, ttls, dedup = {}, {}, {}, {}
for i = 1, n do
  local id, token, ttl, key = string.match(ARGV[i * 2 - 1], '^([^|]+)|(%d+)|(%d+)|(.*)$')
  ids[i], tokens[i], ttls[i], dedup[i] = id or '', token, tonumber(ttl), key
end
local owners = redis.call('HMGET', KEYS[2], unpack(ids))
local waited = redis.call('ZMSCORE', KEYS[8], unpack(ids))
local acked, results, expiries, announced = {}, {}, {}, {}
for i = 1, n do
  local owner = owners[i]
  if holds(owner, tokens[i]) then
    local id, ttl_ms = ids[i], ttls[i]
    release_key(KEYS[5], id, dedup[i])
    acked[#acked + 1] = id
    if ttl_ms > 0 then
      results[#results + 1] = id
      results[#results + 1] = ARGV[i * 2]
      expiries[#expiries + 1] = now + ttl_ms
      expiries[#expiries + 1] = id
      if waited[i] then
        announce(KEYS[10 + i], 1, ttl_ms)
        announced[#announced + 1] = id
      end
    end
    out[i] = 1
  else
    out[i] = 0
  end
end
drop_claims(KEYS[2], KEYS[1], KEYS[3], KEYS[4], acked)
call_many('HDEL', KEYS[9], acked)
call_many('HDEL', KEYS[10], acked)
call_many('ZREM', KEYS[8], announced)
call_many('HSET', KEYS[6], results)
call_many('ZADD', KEYS[7], expiries)
return out
