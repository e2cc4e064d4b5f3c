-- PROBE (bench/flat_probe.py), not used by drumbeat: finish_runs.lua for a flat schedule, one
-- zset of schedules by next run and one hash of their records per shard instead of the wheel's
-- buckets. The same fencing, bookkeeping and record update per run; one call per key per batch.
--
-- KEYS[1] due (zset)    KEYS[2] leases (zset)  KEYS[3] owners (hash)  KEYS[4] state (hash)
-- KEYS[5] faults (hash) KEYS[6] wake (zset)    KEYS[7] jobs (hash)
-- KEYS[8] records (hash) KEYS[9] schedules by next run (zset)
-- ARGV    one per run, packed as finish_runs.lua's (its bucket part is ignored)
-- Returns one integer per run: 1 settled, 0 refused (lease lost)
-- (Defined here, not in _lib.lua: every script runs all of _lib's definitions on every call.)
-- A schedule's record (`v`, or nil) after one of its runs (`run`) ended, and the due time of
-- its next run, or nil when it is paused: what _lib.lua's record parser, these changes, then its
-- formatter give, without decoding the task and arguments (copied as they are) nor building a
-- table (the parse and format were half the Lua time of settling a run). nil for an unreadable
-- record. The run's lateness (its start, the claim's time, less its due time; 0 if it started
-- early or its due time is unknown) goes in with its start and duration, in the same write:
-- the per-schedule figure the dashboard shows costs no command of its own. `ran` is
-- last_ms|late, taken and replaced as one (each capture and format costs Lua time per run).
-- Fields that do not change are copied as the strings they came as, and only the numbers a
-- change needs are converted ("x + 0" or arithmetic: one strtod each, where tonumber() costs
-- two) and formatted (string.format calls sprintf once per field, %s included): the
-- conversions were a tenth of settling a run. The integers are written as they were read
-- (digits only, as every writer formats them), so the record is what the formatter gave.
local function after_run(v, run)
  if not v then return nil end
  local pattern = '^(%d+)|(%-?%d+)|(%d+)|(%d+)|(%d+)|(%d+)|(%-?%d*)|(%d+|%d*)|(%d+|.*)$'
  local gen, grid, flags, runs, fails, misf, rel, ran, tail = string.match(v, pattern)
  if not gen then
    local old = schedule_of_old_layout(v)
    if not old then return nil end
    gen, grid, flags, runs, fails, misf, rel, ran, tail = string.match(old, pattern)
    if not gen then return nil end
  end
  -- The grid slot written: the run's next one, unless the definition changed while it ran.
  local same = gen == run.gen or gen + 0 == run.gen + 0
  local new_grid, new_raw = nil, grid
  if same then new_grid, new_raw = run.grid + 0, run.grid else new_grid = grid + 0 end
  if run.outcome == 'skip' then
    misf = string.format('%d', misf + 1)
    if rel ~= '' then
      local last_start = grid + rel
      rel = last_start > 0 and string.format('%d', last_start - new_grid) or ''
    end
  else
    runs = string.format('%d', runs + 1)
    if run.outcome == 'fail' then fails = string.format('%d', fails + 1) end
    local late = 0
    if run.due_was ~= '' then
      late = (run.first ~= '' and run.first + 0 or run.started) - run.due_was
      if late < 0 then late = 0 end  -- promoted a little ahead of its time
    end
    ran = run.ms .. '|' .. (late == 0 and '0' or string.format('%d', late))
    rel = run.started > 0 and string.format('%d', run.started - new_grid) or ''
  end
  local record = gen .. '|' .. new_raw .. '|' .. flags .. '|' .. runs .. '|' .. fails .. '|'
    .. misf .. '|' .. rel .. '|' .. ran .. '|' .. tail
  -- One digit is never PAUSED_FLAG or more (a priority alone).
  if #flags > 1 and flags + 0 >= PAUSED_FLAG then return record, nil, nil end
  if same then return record, run.due + 0, run.due end
  return record, new_grid, new_raw
end

local out = {}
local runs, members = {}, {}
for i, packed in ipairs(ARGV) do
  local member, token, outcome, ms, gen, grid, due, due_was, first, bucket, slot, err =
    string.match(packed,
      '^([^|]+)|(%d+)|(%a+)|(%d+)|(%-?%d+)|(%-?%d+)|(%-?%d+)|(%-?%d*):?(%d*)|(%d+)/(%d+)|(.*)$')
  -- Kept as the strings they came as: after_run converts what it needs.
  runs[i] = {member = member, token = token, outcome = outcome, ms = ms, gen = gen,
             grid = grid, due = due, bucket = bucket, slot = slot, err = err,
             due_was = due_was, first = first}
  members[i] = member or ''
end

-- Fencing, then the run's bookkeeping dropped: one call per key for the whole batch.
local owners = redis.call('HMGET', KEYS[3], unpack(members))
local settled, all = {}, {}
for i, run in ipairs(runs) do
  local owner = owners[i]
  if run.member and holds(owner, run.token) then
    out[i] = 1
    local started = string.match(owner, '|(%d+)$')
    run.started = started and started + 0 or 0
    settled[#settled + 1] = run.member
    all[#all + 1] = run
  else
    out[i] = 0
  end
end
drop_claims(KEYS[3], KEYS[2], KEYS[7], KEYS[4], settled)

-- Totals and next runs: one read, one write of the records, one ZADD for the next runs.
local faults = {}
if #all > 0 then
  local ids = {}
  for j, run in ipairs(all) do ids[j] = run_schedule_id(run.member) end
  local records = redis.call('HMGET', KEYS[8], unpack(ids))
  local writes, waits = {}, {}
  for j, run in ipairs(all) do
    local record, next_due, next_raw = after_run(records[j], run)
    if record then
      if run.outcome == 'fail' then faults[#faults + 1], faults[#faults + 2] = ids[j], run.err end
      writes[#writes + 1], writes[#writes + 2] = ids[j], record
      if next_due then waits[#waits + 1], waits[#waits + 2] = next_raw, ids[j] end
    end
  end
  call_many('HSET', KEYS[8], writes)
  call_many('ZADD', KEYS[9], waits)
end
call_many('HSET', KEYS[5], faults)
return out
