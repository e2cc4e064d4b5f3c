-- Moves schedules of one wheel bucket into the time slots (`drumbeat schedules migrate --to
-- slots`, with the workers stopped): a waiting schedule's record goes, as it is, into the slot
-- of its due time, a paused one into `paused`, and both leave the bucket; the bucket's keys and
-- its marker in `due` go once it is empty (the limited and routed schedules, which the time
-- slots cannot keep yet, stay). All or nothing: the bucket stays as it is when a schedule
-- passed has a run queued or in flight (a run state), moved since the caller read the bucket,
-- is in the time slots already, or has a record that cannot be read.
--
-- KEYS[1] wheel:<b> (zset)  KEYS[2] schedules:<b> (hash)  KEYS[3] due (zset)  KEYS[4] state
-- (hash)  KEYS[5] slots (zset)  KEYS[6] where (hash)  KEYS[7] paused (hash)
-- KEYS[7 + i] slot:<ms> of the i-th schedule's due time (any slot key for a paused one)
-- ARGV[1] the bucket's marker in `due`; ARGV[2] n (the schedules to move); then pairs, one per
-- schedule: id, its score in the wheel as read (empty: not in the wheel, paused)
-- Returns {moved into slots, moved into paused}, or {code, id}: -1 moved since read (read again),
-- -2 a run queued or in flight, -3 in the time slots already, -4 unreadable record, -5 neither
-- waiting, paused nor running
local n = tonumber(ARGV[2])
local entries, waiting = {}, 0
for i = 1, n do
  local id, due = ARGV[1 + 2 * i], ARGV[2 + 2 * i]
  local record = redis.call('HGET', KEYS[2], id)
  if not record then return {-1, id} end
  local s = parse_schedule(record)
  if not s then return {-4, id} end
  if redis.call('HEXISTS', KEYS[4], RUN_PREFIX .. id) == 1 then return {-2, id} end
  if redis.call('HEXISTS', KEYS[6], id) == 1 then return {-3, id} end
  local score = redis.call('ZSCORE', KEYS[1], id)
  if due == '' then
    if score then return {-1, id} end
    if not s.paused then return {-5, id} end
  else
    if not score or tonumber(score) ~= tonumber(due) then return {-1, id} end
    waiting = waiting + 1
  end
  entries[i] = id .. '|' .. format_schedule(s)
end
for i = 1, n do
  local id, due = ARGV[1 + 2 * i], ARGV[2 + 2 * i]
  if due == '' then
    redis.call('HSET', KEYS[7], id, entries[i])
    redis.call('HSET', KEYS[6], id, PAUSED_AT)
  else
    redis.call('RPUSH', KEYS[7 + i], entries[i])
    redis.call('ZADD', KEYS[5], due, due)
    redis.call('HSET', KEYS[6], id, due)
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
return {waiting, n - waiting}
