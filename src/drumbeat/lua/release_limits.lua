-- Releases limiter keys and passes what they free on to the jobs parked on them: a worker calls
-- it when a run of a job holding a concurrency permit ends (in any way: done, failed, retried,
-- cancelled, handed back; with the job's id and the run's token, whose permits it drops), and
-- when a claim reports
-- a key's marker "l:<key name>" due (without an id: a rate can book more starts, or a permit may
-- have lapsed with its crashed worker's lease). Per key, it purges lapsed permits whose job
-- holds no lease, then moves the best parked jobs (priority, then order) while the key allows:
-- each gets a permit (a ticket: acquire_limits.lua does not park it on that key again, and
-- checks only its rate at the start) and goes to its queue's `ready` at its own score (a rate
-- that allows it now, or within LIMIT_NEAR_MS), or to its `due` at its booked start (within
-- `horizon` ms; not while a backlog waits in that `ready`, see acquire_limits.lua), at most
-- `batch` per key. The key's marker is re-scored for when it next needs a look, or dropped
-- when nothing is parked. The shard's `parking` counts follow every job moved on and every
-- marker added or dropped (see count_parking; an entry whose job was cancelled was counted off
-- by cancel.lua).
--
-- The release of a run that ended is fenced by its token: the run's settle may reach Redis
-- first, and the job's next run (a schedule's, a retry's) be claimed and granted before it:
-- its acquisition took the ended run's permit as its own (a ticket), so a release that came
-- after dropped the permit of a running job, and the key let one more run in (seen in CI:
-- two runs at once under concurrency 1). So a permit goes only while no other run owns the
-- job.
--
-- KEYS[1] leases (zset)  KEYS[2] state (hash)  KEYS[3] parking (hash)  KEYS[4] owners (hash)
-- KEYS[3q + 2], KEYS[3q + 3], KEYS[3q + 4] ready, due, wake (zsets) of the q-th queue
--          (n = ARGV[3])
-- KEYS[3n + 2 + 3i], KEYS[3n + 3 + 3i], KEYS[3n + 4 + 3i] limit:<key> (hash), permits:<key>
--          (zset), parked:<key> (zset) of the i-th key
-- ARGV[1] the id of the job whose permits go, or ''   ARGV[2] the token of its run that ended
-- ARGV[3] number of queues (n)   ARGV[4] horizon_ms   ARGV[5] lease_ms
-- ARGV[6] batch (most jobs moved per key)
-- ARGV[6 + q] name of the q-th queue ("default" for the default one)
-- ARGV[6 + n + i] name of the i-th key
-- A parked job of a queue not given stays parked (a worker serving it moves it on: the marker
-- also goes to the due of any queue given that holds one).
-- Returns {jobs moved on, the earliest time it wrote to a `due` (a booked start or a marker), or
--          -1}: a worker whose claim reply came before this call must not sleep past it.
local now = now_ms()
local id, token, nq = ARGV[1], ARGV[2], tonumber(ARGV[3])
local horizon, lease_ms, batch = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local names, queues = {}, {}
for q = 1, nq do
  names[q] = ARGV[6 + q]
  queues[q] = {ready = KEYS[3 * q + 2], due = KEYS[3 * q + 3], wake = KEYS[3 * q + 4]}
end
if id ~= '' then
  local owner = redis.call('HGET', KEYS[4], id)
  if owner and not holds(owner, token) then id = '' end  -- its next run holds the permit now
end
local sizes = {}
local function backlog(q)
  if sizes[q] == nil then sizes[q] = redis.call('ZCARD', queues[q].ready) end
  return sizes[q] > 0
end
local woken, moved, earliest = {}, 0, -1
local function wrote_due(at)
  if earliest < 0 or at < earliest then earliest = at end
end
local base = 3 * nq + 2
for i = 1, #ARGV - 6 - nq do
  local l = {name = ARGV[6 + nq + i], limit = KEYS[base + 3 * i], permits = KEYS[base + 3 * i + 1],
             parked = KEYS[base + 3 * i + 2], leases = KEYS[1]}
  limit_config(l)
  if id ~= '' then redis.call('ZREM', l.permits, id) end
  local held = permits_held(l, now)
  local member = LIMIT_PREFIX .. l.name
  local candidates = redis.call('ZRANGE', l.parked, '0', string.format('%d', batch - 1))
  local states = #candidates > 0 and redis.call('HMGET', KEYS[2], unpack(candidates)) or {}
  local book = l.book
  for j, job in ipairs(candidates) do
    if l.concurrency > 0 and held >= l.concurrency then break end
    local start = now
    if l.interval > 0 then
      start = booking_at(l, now)
      if start - now > horizon then break end
    end
    local s = parse_state(states[j])
    local q = queue_index(names, s.queue)
    -- As in acquire_limits.lua: a start booked in `due` would come back behind a backlog in
    -- `ready`, late; with one, only a start due now or near moves on (to `ready`, in place).
    if q and start - now > LIMIT_NEAR_MS and backlog(q) then break end
    if not states[j] then
      redis.call('ZREM', l.parked, job)  -- cancelled while parked (cancel.lua)
    elseif q ~= nil then
      redis.call('ZREM', l.parked, job)
      count_parking(KEYS[3], PARKED_FIELD, names[q], -1)
      if l.interval > 0 then
        book = math.max(book, start) + l.interval
        l.book = book
      end
      redis.call('ZADD', l.permits, start + lease_ms, job)
      held = held + 1
      if start <= now + LIMIT_NEAR_MS then  -- acquire_limits.lua grants a near start
        redis.call('ZADD', queues[q].ready, ready_score(s.priority, s.seq), job)
        sizes[q] = (sizes[q] or 0) + 1
        woken[q] = true
      else
        redis.call('ZADD', queues[q].due, start, job)
        wrote_due(start)
        if redis.call('ZRANGE', queues[q].due, '0', '0')[1] == job then woken[q] = true end
      end
      moved = moved + 1
    end
  end
  if moved > 0 and l.interval > 0 then
    redis.call('HSET', l.limit, 'book', string.format('%.3f', book))
  end
  if redis.call('ZCARD', l.parked) > 0 then
    local at = limit_attention(l, now, horizon)
    wrote_due(at)
    local head = redis.call('ZRANGE', l.parked, '0', '0')[1]
    local hq = queue_index(names, parse_state(redis.call('HGET', KEYS[2], head)).queue)
    for q, queue in ipairs(queues) do
      if q == hq then
        if redis.call('ZADD', queue.due, at, member) == 1 then
          count_parking(KEYS[3], MARKERS_FIELD, names[q], 1)
        end
        if redis.call('ZRANGE', queue.due, '0', '0')[1] == member then woken[q] = true end
      else
        redis.call('ZADD', queue.due, 'XX', at, member)
      end
    end
  else
    for q, queue in ipairs(queues) do
      if redis.call('ZREM', queue.due, member) == 1 then
        count_parking(KEYS[3], MARKERS_FIELD, names[q], -1)
      end
    end
  end
end
for q in pairs(woken) do wake(queues[q].wake) end
return {moved, earliest}
