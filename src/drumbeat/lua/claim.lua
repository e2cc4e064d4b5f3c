-- Claims up to `limit` runnable items for one worker: promotes what is due (delayed jobs and
-- retries), takes the best of `ready` by priority, and gives each a lease and a fresh fencing
-- token. Reports the schedule buckets that are due: their keys are not known before the call,
-- so the worker promotes them with promote_runs.lua and claims again. Records the lateness of
-- every schedule run it starts.
--
-- KEYS[1] ready (zset)  KEYS[2] due (zset)    KEYS[3] jobs (hash)   KEYS[4] state (hash)
-- KEYS[5] owners (hash) KEYS[6] leases (zset) KEYS[7] fence (string) KEYS[8] seq (string)
-- KEYS[9] wake (zset)   KEYS[10] lateness (hash)
-- ARGV[1] worker id   ARGV[2] limit   ARGV[3] lease_ms   ARGV[4] most due entries to promote
-- Returns {now_ms, next_due_ms or -1, {due bucket numbers}, then per item: id, spec or false,
--          attempt, stalls, token, priority, extra}; for a schedule run the id is
--          "s:<schedule id>", the spec "<task name>|<arguments and cadence>" and extra
--          "<due>:<grid>:<generation>:<manual>"
local now = now_ms()
local worker, limit, lease_ms = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local deadline = now + lease_ms
local buckets = {}
local out = {now, -1, buckets}
local lateness = {}
-- A reported bucket's marker steps aside this long, so other workers do not promote the same
-- bucket meanwhile; promoting re-scores it (and if the worker died, it is due again then).
local BUCKET_HOLD_MS = 1000

-- Gives `id` to this worker: a fresh token, a lease, the attempt counted.
local function take(id, spec, s, token)
  s.attempt = s.attempt + 1
  redis.call('HSET', KEYS[4], id, format_state(s))
  redis.call('HSET', KEYS[5], id, string.format('%d|%s|%d', token, worker, now))
  redis.call('ZADD', KEYS[6], deadline, id)
  if s.attempt == 1 and spec and run_schedule_id(id) then
    local run_due = tonumber(string.match(s.key, '^(%-?%d+):'))
    if run_due then lateness[#lateness + 1] = math.max(0, now - run_due) end
  end
  for _, v in ipairs({id, spec, s.attempt, s.stalls, token, s.priority, s.key}) do
    out[#out + 1] = v
  end
end

local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, tonumber(ARGV[4]))
local members, held = {}, {}
for _, member in ipairs(due) do
  local bucket = wheel_bucket(member)
  if bucket then
    buckets[#buckets + 1] = bucket
    held[#held + 1] = now + BUCKET_HOLD_MS
    held[#held + 1] = member
  else
    members[#members + 1] = member
  end
end
if #held > 0 then redis.call('ZADD', KEYS[2], unpack(held)) end
-- When everything due fits in this worker's free slots and nothing else waits, it is claimed
-- straight from `due`: the same result as promote-then-pop, without the detour through `ready`.
local direct = #members > 0 and #members <= limit and redis.call('ZCARD', KEYS[1]) == 0
if #members > 0 then
  local states = redis.call('HMGET', KEYS[4], unpack(members))
  local specs = direct and redis.call('HMGET', KEYS[3], unpack(members))
  local seq = redis.call('INCRBY', KEYS[8], #members) - #members
  local token = direct and redis.call('INCRBY', KEYS[7], #members) - #members
  for i, member in ipairs(members) do
    local s = parse_state(states[i])
    s.seq = seq + i
    if direct then
      take(member, specs[i], s, token + i)
    else
      redis.call('HSET', KEYS[4], member, format_state(s))
      redis.call('ZADD', KEYS[1], ready_score(s.priority, s.seq), member)
    end
  end
  redis.call('ZREM', KEYS[2], unpack(members))
end

if not direct and limit > 0 then
  local popped = redis.call('ZPOPMIN', KEYS[1], limit)
  local n = #popped / 2
  if n > 0 then
    local ids = {}
    for i = 1, n do ids[i] = popped[i * 2 - 1] end
    local specs = redis.call('HMGET', KEYS[3], unpack(ids))
    local states = redis.call('HMGET', KEYS[4], unpack(ids))
    local token = redis.call('INCRBY', KEYS[7], n) - n
    for i, id in ipairs(ids) do
      take(id, specs[i], parse_state(states[i]), token + i)
    end
  end
end
record_lateness(KEYS[10], now, lateness)

-- One marker woke this worker; pass it on so work left behind does not wait for a timeout.
if redis.call('ZCARD', KEYS[1]) > 0 then wake(KEYS[9]) end
local head = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
if head[2] then out[2] = tonumber(head[2]) end
return out
