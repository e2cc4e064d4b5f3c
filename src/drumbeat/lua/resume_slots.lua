-- Resumes paused schedules by id: a paused entry goes into the slot of its next
-- due time from now, with that grid slot (the caller worked both out from the entry it read:
-- the paused stretch is not caught up); a pause waiting for a run in flight is called off. The
-- caller read `where` and `paused` first: an entry changed since it read it (an upsert) is
-- answered -1, to be sent again with its new cadence.
--
-- KEYS[1] slots (zset)  KEYS[2] where (hash)  KEYS[3] pending (hash)  KEYS[4] paused (hash)
-- KEYS[5] wake (zset)  KEYS[5 + i] slot:<ms> of the i-th schedule's next due time (any slot
-- key when `where` did not say "p")
-- ARGV[1] n; then groups of 5, one per schedule: id, what `where` gave (empty if nothing), the
-- generation of the paused entry read, its next grid slot ms, its next due ms (the last three
-- empty unless `where` said "p")
-- Returns one integer per schedule: 1 resumed, 0 unknown or not paused, -1 moved: send again
local n = tonumber(ARGV[1])
local out, woke = {}, false
for i = 1, n do
  local a = 1 + (i - 1) * 5
  local id, read, gen, grid, due = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5]
  local at = redis.call('HGET', KEYS[2], id)
  if (at or '') ~= read then
    out[i] = -1
  elseif at == PAUSED_AT then
    local entry = redis.call('HGET', KEYS[4], id)
    local s = entry and parse_schedule(entry_record(entry))
    if not s or string.format('%d', s.gen) ~= gen then
      out[i] = -1
    else
      s.paused, s.grid = false, tonumber(grid)
      redis.call('RPUSH', KEYS[5 + i], id .. '|' .. format_schedule(s))
      redis.call('ZADD', KEYS[1], due, due)
      redis.call('HSET', KEYS[2], id, due)
      redis.call('HDEL', KEYS[4], id)
      woke, out[i] = true, 1
    end
  else
    local pause, change = pending_parts(redis.call('HGET', KEYS[3], id))
    if pause then set_pending(KEYS[3], id, false, change) end
    out[i] = pause and 1 or 0
  end
end
if woke then wake(KEYS[5]) end
return out
