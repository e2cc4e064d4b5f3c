-- Acks finished jobs: drops lease, record, saved progress, cancel request and dedup key, and
-- stores each outcome for its TTL (a cancelled job's outcome too: it is settled here).
-- A job whose fencing token no longer matches (its lease was taken over) is left untouched.
-- A job someone waits for (`waiting`, see job_status.lua) is announced on its `done` list.
--
-- KEYS[1] leases (zset)  KEYS[2] owners (hash)  KEYS[3] jobs (hash)   KEYS[4] state (hash)
-- KEYS[5] uniq (hash)    KEYS[6] results (hash) KEYS[7] expires (zset) KEYS[8] waiting (zset)
-- KEYS[9] progress (hash) KEYS[10] cancels (hash)
-- KEYS[10+i] done:<id> (list) of the i-th job
-- KEYS[10+n+1..] the workflow keys (_workflows.lua: workflow_keys): the jobs' dependents are
--         released (or dead-lettered, for a cancelled job), and the ends of batch members
--         counted (count_member), in this call
-- ARGV[1] how the jobs ended, for their dependents: ok, or cancelled
-- ARGV[2] outcome ttl ms of dependents dead-lettered here  ARGV[3] q: how many queues' keys
--         the workflow keys hold  ARGV[3 + 1..q] their names (the default one first)
-- ARGV    then pairs, one per job: "<id>|<token>|<ttl_ms>|<dedupkey>" (ttl 0 stores nothing;
--         the dedup key as the claim handed it out, often empty), outcome
--         (packed: every argument costs the client an encoding step)
-- Returns one integer per job: 1 acked, 0 refused (lease lost)
local now = now_ms()
local nq = tonumber(ARGV[3])
local at = 3 + nq
local n = (#ARGV - at) / 2
local out = {}
if n < 1 then return out end
local ids, tokens, ttls, dedup = {}, {}, {}, {}
for i = 1, n do
  local id, token, ttl, key = string.match(ARGV[at + i * 2 - 1], '^([^|]+)|(%d+)|(%d+)|(.*)$')
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
      results[#results + 1] = ARGV[at + i * 2]
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
if #acked > 0 then
  local w = workflow_keys(10 + n, {unpack(ARGV, 4, 3 + nq)}, tonumber(ARGV[2]))
  settle_ended(w, acked, ARGV[1], now)
end
return out
