-- Claims due runs of schedules kept as time slots (docs/design/time-slots.md; opt-in:
-- Settings.schedule_store "slots"): pops the entries of the due slots the worker passed (the
-- upcoming slots of its last reply), as many as it has room for (the rest stay due in their
-- slot), into its incarnation's in-flight hash, and renews the incarnation's lease in
-- `runners`. No state, owner, lease or fencing token per run: a run is the worker's while its
-- entry is in that hash (the reaper empties the hash of an incarnation whose lease lapsed, and
-- its next claim is told so). A slot's runs share their due time, so its lateness is counted
-- once, for all of them.
--
-- KEYS[1] slots (zset)  KEYS[2] runners (zset)  KEYS[3] inflight:<incarnation> (hash)
-- KEYS[4] lateness (hash)  KEYS[4 + i] slot:<ms> of the i-th passed slot
-- ARGV[1] incarnation  ARGV[2] limit  ARGV[3] lease ms  ARGV[4] 1 on the incarnation's first
-- claim, else 0  ARGV[5] most upcoming slots wanted (0: none)  ARGV[5 + i] the i-th passed
-- slot's ms
-- Returns {now, upcoming, next, then per slot taken from: its ms, {its entries}}: upcoming is
-- the ms of the slots due by now + UPCOMING_MS (at most the number wanted), or false when none
-- were wanted; next the ms of the earliest slot left, or -1 when none is. {now, 'reaped'} when
-- the incarnation's lease lapsed and the reaper took its runs back (it must claim as a new
-- incarnation). An entry without a schedule id (not `<id>|...` nor `<id>;...`: written by
-- something else) is replied and dropped, not held.
local now = now_ms()
local incarnation = ARGV[1]
if ARGV[4] ~= '1' and not redis.call('ZSCORE', KEYS[2], incarnation) then
  return {now, 'reaped'}
end
local room = tonumber(ARGV[2])
local now_text = string.format('%d', now)
local out, held, emptied, samples, weights = {now, false, -1}, {}, {}, {}, {}
for i = 6, #ARGV do
  if room <= 0 then break end
  local ms, key = ARGV[i], KEYS[i - 1]
  if ms + 0 <= now then
    local got = redis.call('LPOP', key, string.format('%d', room))
    if got then
      -- The in-flight value keeps the run's due time and start: a reaped run keeps both.
      local head, fresh = ms .. '|' .. now_text .. '|', 0
      for _, entry in ipairs(got) do
        local bar = string.find(entry, '[|;]')
        if bar and bar > 1 then
          local n = #held
          held[n + 1], held[n + 2] = string.sub(entry, 1, bar - 1), head .. entry
          -- A run back from a lapsed lease was counted when it was first claimed.
          if string.byte(entry, bar) == 124 then fresh = fresh + 1 end
        end
      end
      room = room - #got
      out[#out + 1], out[#out + 2] = ms, got
      if fresh > 0 then samples[#samples + 1], weights[#weights + 1] = now - ms, fresh end
      -- Room left: the slot gave fewer than asked, so it is empty (and Redis deleted it).
      if room > 0 or redis.call('EXISTS', key) == 0 then
        emptied[#emptied + 1] = ms
      end
    else
      emptied[#emptied + 1] = ms
    end
  end
end
call_many('HSET', KEYS[3], held)
if #emptied > 0 then redis.call('ZREM', KEYS[1], unpack(emptied)) end
redis.call('ZADD', KEYS[2], string.format('%d', now + tonumber(ARGV[3])), incarnation)
record_lateness(KEYS[4], now, samples, weights)
local head = redis.call('ZRANGE', KEYS[1], '0', '0')
if head[1] then out[3] = tonumber(head[1]) end
local want = tonumber(ARGV[5])
if want > 0 then
  out[2] = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now + UPCOMING_MS),
    'LIMIT', '0', string.format('%d', math.min(want, UPCOMING)))
end
return out
