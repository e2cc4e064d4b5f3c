-- Claims due runs of schedules kept as time slots (docs/design/time-slots.md; opt-in:
-- Settings.schedule_store "slots"): pops the entries of the due slots the worker passed (the
-- upcoming slots of its last reply), as many as it has room for (the rest stay due in their
-- slot), into one list for this claim (`claimed:<incarnation>:<n>`, each slot's entries after
-- a header with its ms and the claim's), notes the claim's number in the incarnation's
-- `inflight` set, and renews the incarnation's lease in `runners`. Nothing is written per run
-- but the entry's push: no state, owner, lease or fencing token. A run is its claimer's while
-- `where` still names the slot it was claimed from (its settle moves it on, as do the reaper
-- and a hand-back: settle_slots.lua); the list only lets the reaper find the runs of an
-- incarnation whose lease lapsed (and its next claim is told so). A slot's runs share their
-- due time, so its lateness is counted once, for all of them.
--
-- KEYS[1] slots (zset)  KEYS[2] runners (zset)  KEYS[3] inflight:<incarnation> (set)
-- KEYS[4] lateness (hash)  KEYS[5] claimed:<incarnation>:<n>
-- KEYS[5 + i] slot:<ms> of the i-th passed slot
-- ARGV[1] incarnation  ARGV[2] limit  ARGV[3] lease ms  ARGV[4] 1 on the incarnation's first
-- claim, else 0  ARGV[5] most upcoming slots wanted (0: none)  ARGV[6] the claim's number n
-- (new for each claim of the incarnation)  ARGV[6 + i] the i-th passed slot's ms
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
for i = 7, #ARGV do
  if room <= 0 then break end
  local ms, key = ARGV[i], KEYS[i - 1]
  if ms + 0 <= now then
    local got = redis.call('LPOP', key, string.format('%d', room))
    if got then
      -- The header keeps the runs' due time and start: a reaped run keeps both.
      local fresh, header = 0, #held + 1
      held[header] = '#' .. ms .. '|' .. now_text
      for _, entry in ipairs(got) do
        local bar = string.find(entry, '[|;]')
        if bar and bar > 1 then
          held[#held + 1] = entry
          -- A run back from a lapsed lease was counted when it was first claimed.
          if string.byte(entry, bar) == 124 then fresh = fresh + 1 end
        end
      end
      if #held == header then held[header] = nil end  -- none held: no header either
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
if #held > 0 then
  call_many('RPUSH', KEYS[5], held)
  redis.call('SADD', KEYS[3], ARGV[6])
end
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
