-- Claims up to `limit` runnable items for one worker: promotes what is due (delayed jobs and
-- retries), takes the best of `ready` by priority, and gives each a lease and a fresh fencing
-- token. Takes the due runs of the schedule buckets the worker passed (those that headed `due`
-- at its last call, see upcoming_buckets) and re-scores their markers that are due; reports
-- other due buckets, whose keys it cannot name, for promote_runs.lua. Records the lateness of
-- every schedule run it starts.
--
-- KEYS[1] ready (zset)  KEYS[2] due (zset)    KEYS[3] jobs (hash)   KEYS[4] state (hash)
-- KEYS[5] owners (hash) KEYS[6] leases (zset) KEYS[7] fence (string) KEYS[8] seq (string)
-- KEYS[9] wake (zset)   KEYS[10] lateness (hash) KEYS[11] tasks (hash) KEYS[12] progress (hash)
-- KEYS[11 + 2i] wheel:<b> (zset), KEYS[12 + 2i] schedules:<b> (hash) of the i-th passed bucket
-- ARGV[1] worker id   ARGV[2] limit   ARGV[3] lease_ms   ARGV[4] most due entries to promote
-- ARGV[4 + i] the i-th passed bucket number
-- Returns {now_ms, next_due_ms or -1, {due bucket numbers to promote}, {upcoming bucket
--          numbers}, priority of the best job left in `ready` or -1, then per item: id, spec
--          or false, attempt, stalls, token, priority, extra, saved progress or false}; for a
--          schedule run the id is "s:<schedule id>", the spec "<task name>|<
--          arguments and cadence>" and extra "<due>:<grid>:<generation>:<manual>"
local now = now_ms()
local limit = tonumber(ARGV[2])
local buckets = {}
local k = {ready = KEYS[1], jobs = KEYS[3], state = KEYS[4], owners = KEYS[5],
           leases = KEYS[6], fence = KEYS[7], seq = KEYS[8], tasks = KEYS[11], due = KEYS[2],
           progress = KEYS[12]}
local c = {worker = ARGV[1], now = now, lease_ms = tonumber(ARGV[3]),
           out = {now, -1, buckets, {}, -1}, lateness = {}}
local passed, is_passed = {}, {}
for i = 1, #ARGV - 4 do
  passed[i] = {ARGV[4 + i], KEYS[11 + 2 * i], KEYS[12 + 2 * i]}
  is_passed[ARGV[4 + i]] = true
end
local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, tonumber(ARGV[4]))
local members, held, passed_due = {}, {}, {}
for _, member in ipairs(due) do
  local bucket = wheel_bucket(member)
  if bucket then
    if is_passed[bucket] then  -- its runs are taken below, and its marker re-scored
      passed_due[bucket] = true
    else
      buckets[#buckets + 1] = bucket
      held[#held + 1] = now + BUCKET_HOLD_MS
      held[#held + 1] = member
    end
  else
    members[#members + 1] = member
  end
end
if #held > 0 then redis.call('ZADD', KEYS[2], unpack(held)) end
-- When everything due fits in this worker's free slots and nothing else waits, it is claimed
-- straight from `due`: the same result as promote-then-pop, without the detour through `ready`.
local direct = #members > 0 and #members <= limit and redis.call('ZCARD', KEYS[1]) == 0
if #members > 0 then
  local raw = redis.call('HMGET', KEYS[4], unpack(members))
  local seq = redis.call('INCRBY', KEYS[8], #members) - #members
  local states = {}
  for i = 1, #members do
    states[i] = parse_state(raw[i])
    states[i].seq = seq + i
  end
  redis.call('ZREM', KEYS[2], unpack(members))
  if direct then
    take_all(k, c, members, redis.call('HMGET', KEYS[3], unpack(members)), states)
  else
    queue_all(k, members, nil, states)
  end
end
if not direct then pop_ready(k, c, limit) end
local early = #passed > 0
  and promote_buckets(k, c, passed, limit - (#c.out - 4) / 7, passed_due)
record_lateness(KEYS[10], now, c.lateness)

-- One marker woke this worker; pass it on so work left behind does not wait for a timeout.
c.out[5] = ready_priority(KEYS[1])
if early or c.out[5] >= 0 then wake(KEYS[9]) end
local head = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
if head[2] then c.out[2] = tonumber(head[2]) end
c.out[4] = upcoming_buckets(KEYS[2], now)
return c.out
