-- Creates or updates schedules by id: an unchanged definition keeps its place and totals; a
-- changed one gets a new generation and its new first due time, unless its run is in flight
-- (its entry is not in the slot `where` names: claimed, or queued as a job): then its
-- definition waits in `pending`, and the run's settle, which has its record, applies it if it
-- changed (2 is answered either way). A paused schedule's entry is changed where it waits, in
-- `paused`. The caller read `where` first (a script may only touch the keys it is passed): a
-- schedule whose entry is no longer where the caller read it (it moved meanwhile: a settle,
-- the reaper) is answered -1, to be sent again.
--
-- KEYS[1] slots (zset)  KEYS[2] where (hash)  KEYS[3] pending (hash)  KEYS[4] tasks (hash)
-- KEYS[5] wake (zset)  KEYS[6] stalled (hash)  KEYS[7] paused (hash)  KEYS[8] queues (set: a
-- queue a schedule's runs go to is registered, as an enqueue registers its job's)
-- KEYS[7 + 2i] slot:<ms> its entry was read in (or any slot key, when `where` had no ms),
-- KEYS[8 + 2i] slot:<ms> of its first due time, of the i-th schedule
-- ARGV[1] n (schedules); then groups of 8, one per schedule: id, the ms `where` gave (empty
-- if none), priority, first grid slot ms, first due ms, task name, the queue its runs go to
-- (empty: the default one), spec
-- Returns one integer per schedule: 1 created, 2 updated (or in flight), 0 unchanged, -1
-- moved: send again
local n = tonumber(ARGV[1])
local out, woke = {}, false
for i = 1, n do
  local a = 1 + (i - 1) * 8
  local id, read, priority = ARGV[a + 1], ARGV[a + 2], tonumber(ARGV[a + 3])
  local grid, due, spec = ARGV[a + 4], ARGV[a + 5], ARGV[a + 8]
  local old_key, new_key = KEYS[7 + 2 * i], KEYS[8 + 2 * i]
  local task = task_code(KEYS[4], ARGV[a + 6], ARGV[a + 7])
  if ARGV[a + 7] ~= '' then redis.call('SADD', KEYS[8], ARGV[a + 7]) end
  local at = redis.call('HGET', KEYS[2], id)
  local paused = at == PAUSED_AT
  local entry = nil
  if at == read and paused then
    entry = redis.call('HGET', KEYS[7], id)
  elseif at and at == read then
    entry = entry_at(old_key, at, id)
  end
  local pause, change = pending_parts(redis.call('HGET', KEYS[3], id))
  if (at or '') ~= read then
    out[i] = -1  -- moved since the caller read `where`
  elseif at and not entry then
    set_pending(KEYS[3], id, pause, due .. '|' .. grid .. '|' .. priority .. '|' .. task .. '|'
      .. spec)
    out[i] = 2
  else
    -- A change left from a run in flight that went back (reaped) is older than this one.
    if change then set_pending(KEYS[3], id, pause, nil) end
    local old = entry and parse_schedule(entry_record(entry))
    if old and old.spec == spec and old.priority == priority and old.task == task then
      out[i] = 0
    else
      local s = old or {gen = 0, paused = false, runs = 0, failures = 0, misfires = 0,
                        last_start = 0, last_ms = 0, late = '0'}
      s.gen, s.grid, s.priority, s.task, s.spec = s.gen + 1, tonumber(grid), priority, task, spec
      if paused then
        redis.call('HSET', KEYS[7], id, id .. '|' .. format_schedule(s))  -- stays paused
      else
        if entry then
          unslot_entry(old_key, at, entry, KEYS[6])
          if redis.call('EXISTS', old_key) == 0 then redis.call('ZREM', KEYS[1], at) end
        end
        redis.call('RPUSH', new_key, id .. '|' .. format_schedule(s))
        redis.call('ZADD', KEYS[1], due, due)
        redis.call('HSET', KEYS[2], id, due)
        woke = true
      end
      out[i] = old and 2 or 1
    end
  end
end
-- Idle workers sleep until the earliest due time they saw: one may have to take these.
if woke then wake(KEYS[5]) end
return out
