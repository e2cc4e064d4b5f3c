-- Acquires the limits a claimed job runs under, all or nothing, or gives up its claim (not an
-- attempt) to wait for them: the worker calls it right after claiming a job of a limited task,
-- with every limiter key of the job (computed from its task and its limit_by argument, which
-- claim.lua cannot see). Per key: a rate (GCRA: starts spaced by `interval`, `tolerance` ahead
-- for a burst) and a concurrency (at most that many members in `permits`).
--  granted  (1): the rate's arrival time advances, the job's permit is (re)written, it runs now;
--  reserved (2): every key allows it, but a rate only at a time within `horizon` ms: that start
--                is booked (arrival time advanced, permit written as a ticket) and the job
--                waits in its queue's `due` until then, where a claim promotes it like a delayed
--                job and this script grants it on its ticket without checking again;
--  parked   (3): some key is full (or a better job waits on it): the job waits in that key's
--                `parked` (scored as in `ready`: priority, then order) and a marker
--                "l:<key name>" in its queue's `due` says when a worker should call
--                release_limits.lua for it (a rate's next booking time; a permit's expiry).
-- A job with a permit (or ticket) on a key is granted on that key without checking again, so a
-- job moved on by release_limits.lua runs without parking twice.
-- A permit's score is when it lapses unless renewed: a run's lease deadline, a ticket's start
-- plus lease_ms. Lapsed permits whose job holds no lease (a crashed worker, a ticket whose job
-- was cancelled) are purged before a full key refuses. Fenced like complete.lua.
--
-- KEYS[1] leases (zset)  KEYS[2] owners (hash)  KEYS[3] state (hash)
-- KEYS[4] due (zset)     KEYS[5] wake (zset)    (due and wake: the job's queue)
-- KEYS[3 + 3i] limit:<key> (hash: tat, interval, tolerance, concurrency)
-- KEYS[4 + 3i] permits:<key> (zset)  KEYS[5 + 3i] parked:<key> (zset) of the i-th key
-- ARGV[1] job id  ARGV[2] token  ARGV[3] lease_ms  ARGV[4] horizon_ms
-- ARGV[1 + 4i] name of the i-th key, then its interval ms (0: no rate), tolerance ms,
--          concurrency (0: none)
-- Returns {1} granted, {2, start ms} reserved, {3, i} parked on the i-th key, {0} lease lost
local now = now_ms()
local id, token = ARGV[1], ARGV[2]
local lease_ms, horizon = tonumber(ARGV[3]), tonumber(ARGV[4])
if not owns(KEYS[2], id, token) then return {0} end
local raw_state = redis.call('HGET', KEYS[3], id)
local s = parse_state(raw_state)
local my_score = ready_score(s.priority, s.seq)

local lims = {}
for i = 1, (#ARGV - 4) / 4 do
  local b = 4 * i
  local l = {name = ARGV[b + 1], interval = tonumber(ARGV[b + 2]),
             tolerance = tonumber(ARGV[b + 3]), concurrency = tonumber(ARGV[b + 4]),
             limit = KEYS[3 + 3 * i], permits = KEYS[4 + 3 * i], parked = KEYS[5 + 3 * i],
             leases = KEYS[1]}
  limit_config(l)
  lims[i] = l
end

-- Decide per key: nil (park), or the earliest start it allows.
local park, start = nil, now
for i, l in ipairs(lims) do
  l.ticket = redis.call('ZSCORE', l.permits, id)
  if not l.ticket then
    local head = redis.call('ZRANGE', l.parked, 0, 0, 'WITHSCORES')
    local at = now
    if head[2] and tonumber(head[2]) < my_score then at = nil end  -- a better job waits
    if at and l.concurrency > 0 and permits_held(l, now) >= l.concurrency then at = nil end
    if at and l.interval > 0 then
      at = math.max(now, l.tat - l.tolerance)
      if at - now > horizon then at = nil end
    end
    if at == nil then
      park = i
      break
    end
    start = math.max(start, at)
  end
end

if park == nil and start <= now then
  for _, l in ipairs(lims) do
    if not l.ticket and l.interval > 0 then
      redis.call('HSET', l.limit, 'tat', string.format('%.3f', math.max(l.tat, now) + l.interval))
    end
    if l.concurrency > 0 then
      redis.call('ZADD', l.permits, now + lease_ms, id)
    elseif l.ticket then
      redis.call('ZREM', l.permits, id)  -- a rate's ticket is spent by the start it booked
    end
  end
  return {1}
end

-- Not now: the claim goes (the attempt it counted is given back), like defer_unknown.lua.
if s.attempt > 0 then s.attempt = s.attempt - 1 end
redis.call('HSET', KEYS[3], id, format_state(s))
redis.call('HDEL', KEYS[2], id)
redis.call('ZREM', KEYS[1], id)
if park == nil then
  for _, l in ipairs(lims) do
    if not l.ticket and l.interval > 0 then
      redis.call('HSET', l.limit, 'tat', string.format('%.3f', math.max(l.tat, start) + l.interval))
    end
    redis.call('ZADD', l.permits, start + lease_ms, id)
  end
  redis.call('ZADD', KEYS[4], start, id)
  wake_if_head(KEYS[4], KEYS[5], id)
  return {2, start}
end
-- A permit held on another key would count against it while the job waits here.
for i, other in ipairs(lims) do
  if i ~= park and other.ticket and other.concurrency > 0 then redis.call('ZREM', other.permits, id) end
end
local l = lims[park]
redis.call('ZADD', l.parked, my_score, id)
local member = LIMIT_PREFIX .. l.name
redis.call('ZADD', KEYS[4], 'LT', limit_attention(l, now, horizon), member)
wake_if_head(KEYS[4], KEYS[5], member)
return {3, park}
