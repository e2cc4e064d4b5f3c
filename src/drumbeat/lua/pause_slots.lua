-- Pauses schedules by id: an entry waiting in its slot moves to `paused`, its record's flags
-- saying so, and `where` says "p". A run in flight or queued as a job finishes, and its settle
-- pauses the schedule (a 'P' before its change in `pending`). A run back from a lapsed lease
-- that waits in a slot is withdrawn with its entry. The caller read `where` first, as for slot_schedules.lua.
--
-- KEYS[1] slots (zset)  KEYS[2] where (hash)  KEYS[3] pending (hash)  KEYS[4] paused (hash)
-- KEYS[5] stalled (hash)  KEYS[5 + i] slot:<ms> its entry was read in (any slot key when
-- `where` had no ms), of the i-th schedule
-- ARGV[1] n; then pairs, one per schedule: id, what `where` gave (empty if nothing)
-- Returns one integer per schedule: 1 paused, 0 unknown, removed or paused already, -1 moved:
-- send again
local n = tonumber(ARGV[1])
local out = {}
for i = 1, n do
  local id, read = ARGV[2 * i], ARGV[2 * i + 1]
  local key = KEYS[5 + i]
  local at = redis.call('HGET', KEYS[2], id)
  local pause, change = pending_parts(redis.call('HGET', KEYS[3], id))
  if (at or '') ~= read then
    out[i] = -1
  elseif not at or at == PAUSED_AT or change == '-' then
    out[i] = 0
  else
    local entry = entry_at(key, at, id)
    local paused = entry and entry_paused(entry, true)
    if paused then
      unslot_entry(key, at, entry, KEYS[5])
      if redis.call('EXISTS', key) == 0 then redis.call('ZREM', KEYS[1], at) end
      redis.call('HSET', KEYS[4], id, paused)
      redis.call('HSET', KEYS[2], id, PAUSED_AT)
      if pause then set_pending(KEYS[3], id, false, change) end
      out[i] = 1
    elseif entry then
      out[i] = 0  -- a record that cannot be read: its run reports it
    else
      set_pending(KEYS[3], id, true, change)  -- in flight: not in the slot `where` names
      out[i] = pause and 0 or 1
    end
  end
end
return out
