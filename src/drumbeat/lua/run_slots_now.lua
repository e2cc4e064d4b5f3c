-- Runs schedules once now, by id: a waiting entry moves to the slot of now. Its record
-- keeps the grid slot it waited for, so its worker sees a run due before its grid slot (an
-- extra run) and puts the schedule back in that slot after it. A paused entry runs too:
-- unpaused for the run, and paused again when it settles (a 'P' in `pending`). An entry due
-- already (a run back from a lapsed lease among them), or in flight, is not run again (a
-- schedule never runs concurrently with itself).
-- The caller read `where` first, as for slot_schedules.lua.
--
-- KEYS[1] slots (zset)  KEYS[2] where (hash)  KEYS[3] pending (hash)  KEYS[4] paused (hash)
-- KEYS[5] stalled (hash)  KEYS[6] wake (zset)  KEYS[7] slot:<now ms>  KEYS[7 + i] slot:<ms>
-- the i-th schedule's entry was read in (any slot key when `where` had no ms)
-- ARGV[1] now ms (the slot of KEYS[7]); ARGV[2] n; then pairs, one per schedule: id, what
-- `where` gave (empty if nothing)
-- Returns one integer per schedule: 1 queued, 0 unknown, removed, due or in flight already,
-- -1 moved: send again
local now, n = ARGV[1], tonumber(ARGV[2])
local out, woke = {}, false
for i = 1, n do
  local id, read = ARGV[1 + 2 * i], ARGV[2 + 2 * i]
  local key = KEYS[7 + i]
  local at = redis.call('HGET', KEYS[2], id)
  local pause, change = pending_parts(redis.call('HGET', KEYS[3], id))
  local entry = nil
  if (at or '') ~= read then
    out[i] = -1
  elseif not at or change == '-' then
    out[i] = 0
  elseif at == PAUSED_AT then
    local paused = redis.call('HGET', KEYS[4], id)
    entry = paused and entry_paused(paused, false)
    if entry then
      redis.call('HDEL', KEYS[4], id)
      set_pending(KEYS[3], id, true, change)
    end
  elseif at ~= QUEUED_AT and tonumber(at) > tonumber(now) then
    entry = slotted_entry(key, id)  -- nil: in flight
    if entry and string.match(entry, '^[^|;]+;') then
      entry = nil  -- a run back from a lapsed lease: it waits in a due slot, to run again
    elseif entry then
      unslot_entry(key, at, entry, KEYS[5])
      if redis.call('EXISTS', key) == 0 then redis.call('ZREM', KEYS[1], at) end
    end
  end
  if entry then
    redis.call('RPUSH', KEYS[7], entry)
    redis.call('HSET', KEYS[2], id, now)
    woke, out[i] = true, 1
  elseif not out[i] then
    out[i] = 0
  end
end
if woke then
  redis.call('ZADD', KEYS[1], now, now)
  wake(KEYS[6])
end
return out
