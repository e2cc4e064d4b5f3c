-- Removes schedules by id: an entry waiting in its slot, or paused, goes at once; a schedule
-- whose run is in flight or queued as a job is marked removed in `pending`, and the run's
-- settle drops it. Its last error goes too. The caller read `where` first, as for slot_schedules.lua.
--
-- KEYS[1] slots (zset)  KEYS[2] where (hash)  KEYS[3] pending (hash)  KEYS[4] faults (hash)
-- KEYS[5] stalled (hash)  KEYS[6] paused (hash)  KEYS[6 + i] slot:<ms> its entry was read in
-- (any slot key when `where` had no ms), of the i-th schedule
-- ARGV[1] n; then pairs, one per schedule: id, the ms `where` gave (empty if none)
-- Returns one integer per schedule: 1 removed, 0 unknown, -1 moved: send again
local n = tonumber(ARGV[1])
local out = {}
for i = 1, n do
  local id, read = ARGV[2 * i], ARGV[2 * i + 1]
  local key = KEYS[6 + i]
  local at = redis.call('HGET', KEYS[2], id)
  if (at or '') ~= read then
    out[i] = -1
  elseif not at then
    out[i] = 0
  else
    local entry = entry_at(key, at, id)
    if at == PAUSED_AT or entry then
      if entry then
        unslot_entry(key, at, entry, KEYS[5])
        if redis.call('EXISTS', key) == 0 then redis.call('ZREM', KEYS[1], at) end
      end
      redis.call('HDEL', KEYS[6], id)
      redis.call('HDEL', KEYS[2], id)
      redis.call('HDEL', KEYS[3], id)  -- a change left from a run that went back (reaped)
    else
      redis.call('HSET', KEYS[3], id, '-')  -- in flight: not in the slot `where` names
    end
    redis.call('HDEL', KEYS[4], id)
    out[i] = 1
  end
end
return out
