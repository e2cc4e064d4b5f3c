-- Claims due runs of schedules from the time slots (docs/design/time-slots.md): takes the entries of the due slots the worker passed
-- (the upcoming slots of its last reply), as many as it has room for (the rest stay due in their
-- slot), each slot's into a list of this claim's, its "lot" (`claimed:<incarnation>:<n>:<ms>`:
-- a whole slot is renamed, in O(1); of a slot with more than the room left, the first entries
-- are moved), notes each lot and the claim's time in the incarnation's `inflight` hash, and
-- renews the incarnation's lease in `runners` and its count of runs held in `busy` (the
-- autoscaler's busy slots: these runs hold no lease). Nothing is written or read per run: no state,
-- owner, lease or fencing token, and the entries do not pass through Lua: the worker reads each
-- lot (`LRANGE`) in the same write, after this call. A run is its claimer's while `where` still
-- names the slot it was claimed from (its settle moves it on, as do the reaper and a hand-back:
-- settle_slots.lua); the lots only let the reaper find the runs of an incarnation whose lease
-- lapsed (and its next claim is told so). A slot's runs share their due time, so its lateness
-- is counted once, for all of them but the runs back from a lapsed lease (`stalled` counts
-- those at each slot's end: they were counted when first claimed).
--
-- KEYS[1] slots (zset)  KEYS[2] runners (zset)  KEYS[3] inflight:<incarnation> (hash)
-- KEYS[4] lateness (hash)  KEYS[5] stalled (hash)  KEYS[6] busy (hash)
-- KEYS[5 + 2i] slot:<ms>, KEYS[6 + 2i] claimed:<incarnation>:<n>:<ms>, of the i-th passed slot
-- ARGV[1] incarnation  ARGV[2] limit  ARGV[3] lease ms  ARGV[4] 1 on the incarnation's first
-- claim, else 0  ARGV[5] most upcoming slots wanted (0: none)  ARGV[6] the claim's number n
-- (new for each claim of the incarnation)  ARGV[6 + i] the i-th passed slot's ms
-- Returns {now, upcoming, next, then per passed slot the number of entries taken into its
-- lot}: upcoming is the ms of the slots due by now + UPCOMING_MS (at most the number wanted),
-- or false when none were wanted; next the ms of the earliest slot left, or -1 when none is.
-- {now, 'reaped'} when the incarnation's lease lapsed and the reaper took its runs back (it
-- must claim as a new incarnation).
local now = now_ms()
local incarnation = ARGV[1]
if ARGV[4] ~= '1' and not redis.call('ZSCORE', KEYS[2], incarnation) then
  return {now, 'reaped'}
end
local room = tonumber(ARGV[2])
local now_text = string.format('%d', now)
local out, lots, emptied, samples, weights, held = {now, false, -1}, {}, {}, {}, {}, 0
local stalls = redis.call('EXISTS', KEYS[5]) == 1
for i = 1, #ARGV - 6 do
  local ms, key, lot = ARGV[6 + i], KEYS[5 + 2 * i], KEYS[6 + 2 * i]
  local took = 0
  if room > 0 and ms + 0 <= now then
    local len = redis.call('LLEN', key)
    if len > 0 and len <= room then
      redis.call('RENAME', key, lot)
      took = len
    elseif len > 0 then
      took = room
      call_many('RPUSH', lot, redis.call('LPOP', key, string.format('%d', room)))
    end
    if took == len then emptied[#emptied + 1] = ms end
    if took > 0 then
      room, held = room - took, held + took
      lots[#lots + 1], lots[#lots + 2] = ARGV[6] .. ':' .. ms, now_text
      -- The stalled runs wait at the slot's end (reap_runners.lua pushes them there).
      local stalled = stalls and tonumber(redis.call('HGET', KEYS[5], ms)) or 0
      local back = math.max(0, took - (len - stalled))
      if stalled > 0 then
        if took == len or back >= stalled then  -- (a slot emptied keeps no count, ever)
          redis.call('HDEL', KEYS[5], ms)
        elseif back > 0 then
          redis.call('HINCRBY', KEYS[5], ms, string.format('%d', -back))
        end
      end
      if took > back then samples[#samples + 1], weights[#weights + 1] = now - ms, took - back end
    end
  end
  out[3 + i] = took
end
if #lots > 0 then
  redis.call('HSET', KEYS[3], unpack(lots))
  redis.call('HINCRBY', KEYS[6], incarnation, string.format('%d', held))
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
