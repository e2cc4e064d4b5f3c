-- Settles finished runs of schedules and puts each schedule back in its bucket for its next
-- run, in the same atomic step, so a run is never lost from its schedule nor doubled. Fenced
-- like complete.lua. If the definition changed while the run was in flight (another
-- generation), the next run follows the new definition's first slot; if it was paused or
-- removed, nothing is rescheduled.
--
-- KEYS[1] due (zset)    KEYS[2] leases (zset)  KEYS[3] owners (hash)  KEYS[4] state (hash)
-- KEYS[5] faults (hash) KEYS[6] wake (zset)    KEYS[7] jobs (hash)
-- KEYS[6 + 2j] wheel:<b> (zset), KEYS[7 + 2j] schedules:<b> (hash) of the j-th bucket named
--          (each bucket once: the runs of a bucket fall due, and end, together)
-- ARGV    one per run, packed (one argument is far cheaper to send than ten):
--         "<member>|<token>|<outcome ok|fail|skip>|<duration ms>|<generation run>|
--          <next grid ms>|<next due ms>|<this run's due ms, or empty>|<bucket>/<j>|
--          <error text, may hold anything>"
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
local settled, buckets = {}, {}
for i, run in ipairs(runs) do
  -- The owner's token and claim time in one match (token|worker|claimed_ms; the greedy `.*`
  -- finds the last `|` from the end), not a match for each (an unanchored one scanned it).
  local owner, token, started = owners[i], nil, nil
  if owner then token, started = string.match(owner, '^(%d+)|.*|(%d+)$') end
  if run.member and token ~= nil and token == run.token then
    out[i] = 1
    run.started = started + 0
    settled[#settled + 1] = run.member
    local group = buckets[run.bucket]
    if not group then
      group = {wheel = KEYS[6 + 2 * run.slot], schedules = KEYS[7 + 2 * run.slot], runs = {}}
      buckets[run.bucket] = group
    end
    group.runs[#group.runs + 1] = run
  else
    out[i] = 0
  end
end
drop_claims(KEYS[3], KEYS[2], KEYS[7], KEYS[4], settled)

-- Totals and next runs, bucket by bucket (a bucket's runs fall due, and end, together).
-- Each bucket's marker is pulled forward to its first next run: one ZADD LT for all buckets.
local faults, marks, earliest = {}, {}, nil
for bucket, group in pairs(buckets) do
  local ids = {}
  for j, run in ipairs(group.runs) do ids[j] = run_schedule_id(run.member) end
  local records = redis.call('HMGET', group.schedules, unpack(ids))
  local writes, waits, first, first_raw = {}, {}, nil, nil
  for j, run in ipairs(group.runs) do
    local record, next_due, next_raw = after_run(records[j], run)
    if record then
      if run.outcome == 'fail' then
        faults[#faults + 1], faults[#faults + 2] = ids[j], run.err
      end
      writes[#writes + 1], writes[#writes + 2] = ids[j], record
      if next_due then
        waits[#waits + 1], waits[#waits + 2] = next_raw, ids[j]
        if not first or next_due < first then first, first_raw = next_due, next_raw end
      end
    end
  end
  call_many('HSET', group.schedules, writes)
  if first then
    call_many('ZADD', group.wheel, waits)
    marks[#marks + 1], marks[#marks + 2] = first_raw, WHEEL_PREFIX .. bucket
    if not earliest or first < earliest then earliest = first end
  end
end
for i = 1, #marks, CALL_MANY_CHUNK do
  redis.call('ZADD', KEYS[1], 'LT', unpack(marks, i, math.min(i + CALL_MANY_CHUNK - 1, #marks)))
end
call_many('HSET', KEYS[5], faults)
-- One check per batch: wake a worker if a bucket now heads `due` at one of these runs' times
-- (idle workers sleep until the earliest due time they saw).
if earliest then
  local head = redis.call('ZRANGE', KEYS[1], '0', '0', 'WITHSCORES')
  if head[2] and tonumber(head[2]) >= earliest then wake(KEYS[6]) end
end
return out
