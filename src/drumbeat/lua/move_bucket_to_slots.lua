-- Moves the schedules of one bucket of the timing wheel (the store before the time slots) into
-- the time slots, at a worker's start (schedules/upgrade.py): a waiting schedule's record goes,
-- as it is, into the slot of its due time, a paused one into `paused`; one whose run is queued
-- or in flight (a run state) stays a job: its job record becomes "<task name>|<record>" and
-- `where` says so, and finish_runs.lua settles it into a slot (a paused one's pause waits in
-- `pending`). A schedule the time slots hold already (registered again by this version) leaves
-- the wheel as it is. The bucket's keys and its marker in `due` go once it is empty. All or
-- nothing: the bucket stays as it is when a schedule passed moved since the caller read the
-- bucket, or has a record that cannot be read.
--
-- KEYS[1] wheel:<b> (zset)  KEYS[2] schedules:<b> (hash)  KEYS[3] due (zset)  KEYS[4] state
-- (hash)  KEYS[5] slots (zset)  KEYS[6] where (hash)  KEYS[7] paused (hash)  KEYS[8] jobs
-- (hash)  KEYS[9] tasks (hash)  KEYS[10] pending (hash)
-- KEYS[10 + i] slot:<ms> of the i-th schedule's due time (any slot key for another)
-- ARGV[1] the bucket's marker in `due`; ARGV[2] n (the schedules to move); then pairs, one per
-- schedule: id, its score in the wheel as read (empty: not in the wheel)
-- Returns {moved into slots, moved into paused, queued or in flight, left to the time slots},
-- or {code, id}: -1 moved since read (read again), -4 unreadable record, -5 neither waiting,
-- paused nor running
local n = tonumber(ARGV[2])
local moves, counts = {}, {0, 0, 0, 0}
for i = 1, n do
  local id, due = ARGV[1 + 2 * i], ARGV[2 + 2 * i]
  local record = redis.call('HGET', KEYS[2], id)
  if not record then return {-1, id} end
  local s = parse_schedule(record)
  if not s then return {-4, id} end
  local score = redis.call('ZSCORE', KEYS[1], id)
  local how
  if redis.call('HEXISTS', KEYS[6], id) == 1 then
    how = 4
  elseif redis.call('HEXISTS', KEYS[4], RUN_PREFIX .. id) == 1 then
    how = 3
  elseif due == '' then
    if score then return {-1, id} end
    if not s.paused then return {-5, id} end
    how = 2
  else
    if not score or tonumber(score) ~= tonumber(due) then return {-1, id} end
    how = 1
  end
  counts[how] = counts[how] + 1
  moves[i] = {id, how, s}
end
for i, move in ipairs(moves) do
  local id, how, s = move[1], move[2], move[3]
  if how == 1 then
    redis.call('RPUSH', KEYS[10 + i], id .. '|' .. format_schedule(s))
    redis.call('ZADD', KEYS[5], ARGV[2 + 2 * i], ARGV[2 + 2 * i])
    redis.call('HSET', KEYS[6], id, ARGV[2 + 2 * i])
  elseif how == 2 then
    redis.call('HSET', KEYS[7], id, id .. '|' .. format_schedule(s))
    redis.call('HSET', KEYS[6], id, PAUSED_AT)
  elseif how == 3 then
    if s.paused then
      s.paused = false
      redis.call('HSET', KEYS[10], id, 'P')
    end
    local name = redis.call('HGET', KEYS[9], '#' .. s.task) or '?'
    redis.call('HSET', KEYS[8], RUN_PREFIX .. id, name .. '|' .. format_schedule(s))
    redis.call('HSET', KEYS[6], id, QUEUED_AT)
  end
end
local ids = {}
for i = 1, n do ids[i] = ARGV[1 + 2 * i] end
call_many('HDEL', KEYS[2], ids)
call_many('ZREM', KEYS[1], ids)
if redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', KEYS[3], ARGV[1])
end
return counts
