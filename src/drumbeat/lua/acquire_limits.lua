-- Acquires the limits a claimed job runs under, all or nothing, or gives up its claim (not an
-- attempt) to wait for them: the worker calls it right after claiming a job of a limited task,
-- with every limiter key of the job (computed from its task and its limit_by argument, which
-- claim.lua cannot see). Per key: a rate (GCRA on the starts themselves: `tat`, the theoretical
-- arrival time, moves `interval` on per start, a start may come `tolerance` early for a burst)
-- and a concurrency (at most that many members in `permits`).
--  granted  (1): the rate's arrival time advances, the job's permit is (re)written, it runs now,
--                or, when its rate allows it within LIMIT_NEAR_MS, at that time: the worker
--                waits those few ms holding its claim (cheaper and closer to the rate than a
--                trip through `due`, whose claim would come about that late anyway);
--  reserved (2): every key allows it, but a rate only at a time within `horizon` ms: that start
--                is booked (the key's booking pointer `book` moves on, a permit is written as a
--                ticket) and the job waits in its queue's `due` until then, where a claim
--                promotes it like a delayed job; at its start it skips the line and the
--                concurrency (settled by its ticket), and the rate is checked again (a booked
--                job that starts late must not let the next one start on its heels: one that
--                then comes early starts at its turn if that is within LIMIT_NEAR_MS, else it
--                is booked again, at the back). With a backlog in its queue's `ready`, only a
--                start within LIMIT_NEAR_MS is booked: a claim queues what comes due behind
--                what waits, so a later one would come back late;
--  parked   (3): some key is full (or a better job waits on it): the job waits in that key's
--                `parked` (scored as in `ready`: priority, then order) and a marker
--                "l:<key name>" in its queue's `due` says when a worker should call
--                release_limits.lua for it (a rate's next booking time; a permit's expiry).
--                Parking behind a better job while the key has room moves that job on.
-- A job with a permit (or ticket) on a key is not parked on that key again, so a job moved on
-- by release_limits.lua runs without parking twice. The shard's `parking` counts follow every
-- job parked or moved on and every marker added (see count_parking). A schedule run that does
-- not start takes back the lateness its claim counted: its next claim counts it, so a run's
-- lateness is counted once, by the claim that starts it.
-- A permit's score is when it lapses unless renewed: a run's lease deadline, a ticket's start
-- plus lease_ms. Lapsed permits whose job holds no lease (a crashed worker, a ticket whose job
-- was cancelled) are purged before a full key refuses. Fenced like complete.lua.
--
-- KEYS[1] leases (zset)  KEYS[2] owners (hash)  KEYS[3] state (hash)
-- KEYS[4] due (zset)     KEYS[5] wake (zset)    KEYS[6] ready (zset)   (the job's queue's)
-- KEYS[7] parking (hash) KEYS[8] lateness (hash)
-- KEYS[6 + 3i] limit:<key> (hash: tat, book, interval, tolerance, concurrency)
-- KEYS[7 + 3i] permits:<key> (zset)  KEYS[8 + 3i] parked:<key> (zset) of the i-th key
-- ARGV[1] job id  ARGV[2] token  ARGV[3] lease_ms  ARGV[4] horizon_ms
-- ARGV[1 + 4i] name of the i-th key, then its interval ms (0: no rate), tolerance ms,
--          concurrency (0: none)
-- Returns {1, start ms, now ms} granted (now: Redis' clock, by which the worker waits for the
--          start), {2, start ms} reserved, {3, i} parked on the i-th key, {0} lease lost

-- The key has room now for the better job parked ahead of this one (`l.behind`, of the same
-- queue): it moves on to `ready` with a ticket (it keeps its place: its score), instead of
-- this job starting out of turn. So while a backlog of new jobs is claimed and parked, the
-- key's rate is still spent, on the jobs first in line.
local function move_head_on(l, now, lease_ms, queue)
  if l.concurrency > 0 and permits_held(l, now) >= l.concurrency then return end
  local at = now
  if l.interval > 0 then
    at = booking_at(l, now)
    if at - now > LIMIT_NEAR_MS then return end
  end
  local hs = parse_state(redis.call('HGET', KEYS[3], l.behind))
  if hs.queue ~= queue then return end
  if redis.call('ZREM', l.parked, l.behind) == 1 then
    count_parking(KEYS[7], PARKED_FIELD, hs.queue, -1)
  end
  if l.interval > 0 then
    redis.call('HSET', l.limit, 'book', string.format('%.3f', math.max(l.book, at) + l.interval))
  end
  redis.call('ZADD', l.permits, at + lease_ms, l.behind)
  redis.call('ZADD', KEYS[6], ready_score(hs.priority, hs.seq), l.behind)
  wake(KEYS[5])
end

local backlog_size = nil
local function backlog()
  if backlog_size == nil then backlog_size = redis.call('ZCARD', KEYS[6]) end
  return backlog_size > 0
end

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
             limit = KEYS[6 + 3 * i], permits = KEYS[7 + 3 * i], parked = KEYS[8 + 3 * i],
             leases = KEYS[1]}
  limit_config(l)
  lims[i] = l
end

-- Decide per key: park on it, or the earliest start it allows (now, or a later booking).
local park, start = nil, now
for i, l in ipairs(lims) do
  l.ticket = redis.call('ZSCORE', l.permits, id)
  local at = now
  if l.ticket then
    -- Booked (or moved on) earlier: its place in line is settled, but a rate is checked again
    -- at the start itself, so starts stay spaced even when booked jobs start late. One that
    -- comes early (a late start before it moved the rate on) starts at its turn if that is
    -- near, else it is booked again, at the back (many booked jobs started late at once).
    local ok_at = l.tat - l.tolerance
    if l.interval > 0 and ok_at > now then
      at = ok_at
      if ok_at - now > LIMIT_NEAR_MS then
        l.rebook = true
        at = booking_at(l, now)
      end
    end
  else
    local head = redis.call('ZRANGE', l.parked, '0', '0', 'WITHSCORES')
    if head[2] and tonumber(head[2]) < my_score then  -- a better job waits
      at = nil
      l.behind = head[1]
    end
    if at and l.concurrency > 0 and permits_held(l, now) >= l.concurrency then at = nil end
    if at and l.interval > 0 then
      at = booking_at(l, now)
      -- A start booked in `due` would come back behind a backlog in `ready` (a claim queues
      -- what comes due behind what waits), late: with one, only a near start is booked.
      if at - now > horizon or (at - now > LIMIT_NEAR_MS and backlog()) then at = nil end
    end
  end
  if at == nil then
    park = i
    break
  end
  start = math.max(start, at)
end

if park == nil and start <= now + LIMIT_NEAR_MS then
  for _, l in ipairs(lims) do
    if l.interval > 0 then
      local fields = {'tat', string.format('%.3f', math.max(l.tat, start) + l.interval)}
      if l.rebook or not l.ticket then  -- a ticket's booking was counted when it was booked
        fields[3], fields[4] = 'book', string.format('%.3f', math.max(l.book, start) + l.interval)
      end
      redis.call('HSET', l.limit, unpack(fields))
    end
    if l.concurrency > 0 then
      redis.call('ZADD', l.permits, now + lease_ms, id)
    elseif l.ticket then
      redis.call('ZREM', l.permits, id)  -- a rate's ticket is spent by the start it booked
    end
  end
  return {1, math.floor(start), now}
end

-- Not now: the claim goes (the attempt it counted is given back), like defer_unknown.lua.
give_back_lateness(KEYS[8], KEYS[2], id, s)
if s.attempt > 0 then s.attempt = s.attempt - 1 end
redis.call('HSET', KEYS[3], id, format_state(s))
redis.call('HDEL', KEYS[2], id)
redis.call('ZREM', KEYS[1], id)
if park == nil then
  for _, l in ipairs(lims) do
    if l.interval > 0 and (l.rebook or not l.ticket) then
      redis.call('HSET', l.limit, 'book', string.format('%.3f', math.max(l.book, start) + l.interval))
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
if l.behind then move_head_on(l, now, lease_ms, s.queue) end
if redis.call('ZADD', l.parked, my_score, id) == 1 then
  count_parking(KEYS[7], PARKED_FIELD, s.queue, 1)
end
local member = LIMIT_PREFIX .. l.name
if redis.call('ZADD', KEYS[4], 'LT', limit_attention(l, now, horizon), member) == 1 then
  count_parking(KEYS[7], MARKERS_FIELD, s.queue, 1)
end
wake_if_head(KEYS[4], KEYS[5], member)
return {3, park}
