-- Takes the due runs out of some schedule buckets (a claim reported the buckets; it cannot open
-- them itself, since their keys were not known before it ran). When nothing waits in `ready`
-- and they all fit in this worker's free slots, it claims them at once (the same result as
-- queue-then-pop, one round trip shorter); otherwise they go to `ready`, where priority decides,
-- and the reply says so. Each run gets its state (due time, grid slot, generation) and a copy
-- of its task name and arguments in `jobs`, so from here on it is leased, fenced, reaped and
-- claimed like a job. A schedule is out of its bucket while its run is queued or in flight, so
-- it cannot run twice at once. Each bucket's marker in `due` is re-scored at its new earliest
-- due time.
--
-- KEYS[1] due (zset)     KEYS[2] ready (zset)   KEYS[3] jobs (hash)    KEYS[4] state (hash)
-- KEYS[5] seq (string)   KEYS[6] wake (zset)    KEYS[7] tasks (hash)   KEYS[8] owners (hash)
-- KEYS[9] leases (zset)  KEYS[10] fence (string) KEYS[11] lateness (hash)
-- KEYS[10 + 2i] wheel:<b> (zset), KEYS[11 + 2i] schedules:<b> (hash) of the i-th bucket
-- ARGV[1] worker id  ARGV[2] limit  ARGV[3] lease_ms  ARGV[3 + i] the i-th bucket number
-- Returns what claim.lua returns, with no buckets: {now_ms, next_due_ms or -1, {}, items...};
-- next_due_ms is now when runs were queued instead (claim again).
local now = now_ms()
local worker, limit, lease_ms = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local out = {now, -1, {}}
local names = {}

local function task_name(code)
  if names[code] == nil then names[code] = redis.call('HGET', KEYS[7], '#' .. code) or '?' end
  return names[code]
end

-- Every due run of the given buckets, out of its bucket.
local runs = {}
for i = 1, #ARGV - 3 do
  local bucket = ARGV[3 + i]
  local wheel_key, schedules_key = KEYS[10 + 2 * i], KEYS[11 + 2 * i]
  local due = redis.call('ZRANGEBYSCORE', wheel_key, '-inf', now, 'WITHSCORES')
  if #due > 0 then
    local ids = {}
    for j = 1, #due, 2 do ids[#ids + 1] = due[j] end
    local records = redis.call('HMGET', schedules_key, unpack(ids))
    for j, id in ipairs(ids) do
      local s = parse_schedule(records[j])
      if s and not s.paused then
        runs[#runs + 1] = {id = RUN_PREFIX .. id, s = s, due = tonumber(due[j * 2])}
      end
    end
    redis.call('ZREM', wheel_key, unpack(ids))
  end
  wheel_settle(KEYS[1], wheel_key, bucket)
end

if #runs > 0 then
  local direct = #runs <= limit and redis.call('ZCARD', KEYS[2]) == 0
  local seq = redis.call('INCRBY', KEYS[5], #runs) - #runs
  local token = direct and redis.call('INCRBY', KEYS[10], #runs) - #runs
  local lateness = {}
  for i, run in ipairs(runs) do
    local s, member = run.s, run.id
    local spec = task_name(s.task) .. '|' .. s.spec
    local state = {attempt = direct and 1 or 0, stalls = 0, priority = s.priority, seq = seq + i,
                   key = string.format('%d:%d:%d:0', run.due, s.grid, s.gen)}
    redis.call('HSET', KEYS[3], member, spec)
    redis.call('HSET', KEYS[4], member, format_state(state))
    if direct then
      redis.call('HSET', KEYS[8], member, string.format('%d|%s|%d', token + i, worker, now))
      redis.call('ZADD', KEYS[9], now + lease_ms, member)
      lateness[#lateness + 1] = math.max(0, now - run.due)
      for _, v in ipairs({member, spec, 1, 0, token + i, s.priority, state.key}) do
        out[#out + 1] = v
      end
    else
      redis.call('ZADD', KEYS[2], ready_score(s.priority, state.seq), member)
    end
  end
  record_lateness(KEYS[11], now, lateness)
  if not direct then
    wake(KEYS[6])
    out[2] = now
    return out
  end
end
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if head[2] then out[2] = tonumber(head[2]) end
return out
