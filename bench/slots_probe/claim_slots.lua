-- PROBE (bench/slots_probe.py), not used by drumbeat: a claim from a schedule kept as time
-- slots. Each slot (1 ms) is a list of the entries due in it, "<id>|<record>", the record as
-- the wheel keeps it; `slots` (zset) holds each non-empty slot's number by its start. A claim
-- pops whole entries from the due slots the worker passed (one LPOP each) and records them in
-- the worker's in-flight hash (id -> entry) in one HSET: a worker-scoped lease (its entry in
-- `workers`, renewed by every claim and heartbeat) in place of a lease, owner and state per
-- run. No per-run Lua but finding the id: the worker parses the entries.
--
-- KEYS[1] slots (zset)  KEYS[2] inflight:<worker> (hash)  KEYS[3] workers (zset)
-- KEYS[3 + i] the i-th passed slot (list)
-- ARGV[1] worker id  ARGV[2] limit  ARGV[3] lease ms  ARGV[3 + i] the i-th passed slot number
-- Returns {now, {slots due within 100 ms, each followed by its start}, entry...} or
-- {now, 'reaped'} when the worker's lease lapsed (its in-flight runs went back).
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
if redis.call('ZSCORE', KEYS[3], ARGV[1]) == false and redis.call('EXISTS', KEYS[2]) == 1 then
  return {now, 'reaped'}
end
local room = tonumber(ARGV[2])
local out, held, emptied = {now, false}, {}, {}
local starts = #KEYS > 3 and redis.call('ZMSCORE', KEYS[1], unpack(ARGV, 4)) or {}
for i = 4, #KEYS do
  if room <= 0 then break end
  local start = starts[i - 3]
  if start and start + 0 <= now then
    local got = redis.call('LPOP', KEYS[i], string.format('%d', room))
    if got then
      for _, entry in ipairs(got) do
        local n = #held
        held[n + 1], held[n + 2] = string.sub(entry, 1, string.find(entry, '|', 1, true) - 1), entry
        out[#out + 1] = entry
      end
      room = room - #got
      if redis.call('EXISTS', KEYS[i]) == 0 then emptied[#emptied + 1] = ARGV[i] end
    else
      emptied[#emptied + 1] = ARGV[i]
    end
  end
end
if #held > 0 then redis.call('HSET', KEYS[2], unpack(held)) end
if #emptied > 0 then redis.call('ZREM', KEYS[1], unpack(emptied)) end
redis.call('ZADD', KEYS[3], string.format('%d', now + tonumber(ARGV[3])), ARGV[1])
local now_text = string.format('%d', now)
out[2] = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now + 100),
  'WITHSCORES', 'LIMIT', '0', '16')
return out
