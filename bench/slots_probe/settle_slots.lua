-- PROBE (bench/slots_probe.py), not used by drumbeat: settles runs claimed by
-- claim_slots.lua. The worker built each schedule's next entry (its record after the run:
-- counters, last start, next grid slot) and grouped them by the slot of their next run. A run
-- is settled if it is still in the worker's in-flight hash (a reaped worker's hash is gone, and
-- a reaped worker takes a new id: fencing per worker incarnation); its entry goes to its next
-- slot, its slot to `where` (for finding a schedule by id).
--
-- KEYS[1] inflight:<worker> (hash)  KEYS[2] where (hash)  KEYS[3] slots (zset)
-- KEYS[3 + j] the j-th next slot (list)
-- ARGV[1] n (runs)  ARGV[2 .. n + 1] ids  ARGV[n + 2 .. 3n + 1] id, next slot number pairs
-- then per next slot j: its number, its start ms, its count c, then c entries (in id order)
-- Returns 1 per run settled, 0 refused
local n = tonumber(ARGV[1])
local held = redis.call('HMGET', KEYS[1], unpack(ARGV, 2, n + 1))
local out, all = {}, true
for i = 1, n do
  if held[i] then out[i] = 1 else out[i] = 0; all = false end
end
if not all then return redis.error_reply('PROBE: a refused run (the probe never makes one)') end
redis.call('HDEL', KEYS[1], unpack(ARGV, 2, n + 1))
redis.call('HSET', KEYS[2], unpack(ARGV, n + 2, 3 * n + 1))
local at, marks = 3 * n + 2, {}
for j = 4, #KEYS do
  local c = tonumber(ARGV[at + 2])
  redis.call('RPUSH', KEYS[j], unpack(ARGV, at + 3, at + 2 + c))
  marks[#marks + 1], marks[#marks + 2] = ARGV[at + 1], ARGV[at]
  at = at + 3 + c
end
if #marks > 0 then redis.call('ZADD', KEYS[3], 'NX', unpack(marks)) end
return out
