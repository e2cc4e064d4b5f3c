-- Housekeeping, bounded per call: requeues jobs whose lease expired (or dead-letters them after
-- too many stalls), and sweeps expired outcomes, old dead letters, silent workers and the marks
-- of `Job.result` waiters that gave up. A schedule
-- run that stalled too often is requeued, not dead-lettered: the worker that claims it counts a
-- failure without running it (a schedule is never lost, and a run that kills workers cannot
-- spin).
--
-- KEYS[1] leases (zset)  KEYS[2] owners (hash)   KEYS[3] state (hash)   KEYS[4] ready (zset)
-- KEYS[5] dead (zset)    KEYS[6] errors (hash)   KEYS[7] uniq (hash)    KEYS[8] results (hash)
-- KEYS[9] expires (zset) KEYS[10] jobs (hash)    KEYS[11] wake (zset)   KEYS[12] workers (zset)
-- KEYS[13] workerinfo (hash) KEYS[14] waiting (zset) KEYS[15] cancels (hash)
-- KEYS[16] progress (hash) KEYS[17] signals (pub/sub channel)
-- KEYS[16 + 2i] ready (zset), KEYS[17 + 2i] wake (zset) of the i-th other queue (ARGV[6 + i]);
--          KEYS[4] and KEYS[11] are the default queue's
-- ARGV[1] max stalls  ARGV[2] limit per sweep  ARGV[3] dead ttl ms  ARGV[4] worker ttl ms
-- ARGV[5] outcome ttl ms for jobs dead-lettered here
-- ARGV[6] 1 to take over the jobs of expired leases, 0 to leave them for now (just after a slot
--         migration, during which no lease could be renewed: see worker/housekeeping.py)
-- ARGV[6 + i] the i-th other queue's name
-- KEYS[17 + 2q + 1..] the workflow keys (_workflows.lua: workflow_keys), with the ready and
--          wake keys of the default queue and each other queue: the dependents of a job
--          dead-lettered or cancelled here are settled (a batch member counted) in this call,
--          and dependents released
--          into a queue their releaser had no keys of (`freed`) move to their queue's `ready`;
--          ended batches whose time is up (`batchttl`) are forgotten
-- A job of a queue not given (registered after the caller read `queues`) is left for the next
-- sweep.
-- Returns {requeued count, 1 if any sweep hit `limit` (call again) else 0, then the ids
--          dead-lettered or cancelled here (their waiters need a wake-up)}
-- A job whose cancel was requested while it ran is not requeued: its outcome is recorded as
-- cancelled.
local now = now_ms()
local max_stalls, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
local out = {0, 0}
local names, readies, wakes, before = {'default'}, {KEYS[4]}, {KEYS[11]}, {}
for i = 1, #ARGV - 6 do
  names[i + 1], readies[i + 1], wakes[i + 1] = ARGV[6 + i], KEYS[16 + 2 * i], KEYS[17 + 2 * i]
end
local w = workflow_keys(17 + 2 * (#names - 1), names, tonumber(ARGV[5]))
local ended = {[DEP_FAILED] = {}, [DEP_CANCELLED] = {}}

local expired = {}
if ARGV[6] == '1' then
  expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', '0', ARGV[2])
end
for _, id in ipairs(expired) do
  local s = parse_state(redis.call('HGET', KEYS[3], id))
  local q = queue_index(names, s.queue)
  if q then
    local owner = redis.call('HGET', KEYS[2], id) or '?|?|0'
    local worker = string.match(owner, '^%d+|(.*)|%d+$') or '?'
    redis.call('HDEL', KEYS[2], id)
    redis.call('ZREM', KEYS[1], id)
    s.stalls = s.stalls + 1
    -- A run keeps its first start (its claim's time) through its stalls: its schedule's
    -- lateness is due -> first start, the recovery shows as its stalls.
    if run_schedule_id(id) and not string.find(s.key, '^[^:]*:[^:]*:[^:]*:[^:]*:') then
      local first = string.match(owner, '|(%d+)$')
      if first and first ~= '0' then s.key = s.key .. ':' .. first end
    end
    redis.call('HSET', KEYS[3], id, format_state(s))
    if redis.call('HDEL', KEYS[15], id) == 1 then
      local k = {uniq = KEYS[7], jobs = KEYS[10], state = KEYS[3], progress = KEYS[16],
                 results = KEYS[8], expires = KEYS[9]}
      end_cancelled(k, id, s, now, tonumber(ARGV[5]))
      out[#out + 1] = id
      ended[DEP_CANCELLED][#ended[DEP_CANCELLED] + 1] = id
    elseif s.stalls > max_stalls and not run_schedule_id(id) then
      release_key(KEYS[7], id, s.key)
      local err = cjson.encode({
        error = string.format('lease expired %d times (worker %s crashed or hung)', s.stalls, worker),
        attempt = s.attempt, stalls = s.stalls, at_ms = now})
      redis.call('ZADD', KEYS[5], now, id)
      redis.call('HSET', KEYS[6], id, err)
      local ttl_ms = tonumber(ARGV[5])
      if ttl_ms > 0 then
        redis.call('HSET', KEYS[8], id, err)
        redis.call('ZADD', KEYS[9], now + ttl_ms, id)
      end
      out[#out + 1] = id
      ended[DEP_FAILED][#ended[DEP_FAILED] + 1] = id
    else
      if not before[q] then before[q] = ready_priority(readies[q]) end
      redis.call('ZADD', readies[q], ready_score(s.priority, s.seq), id)
      out[1] = out[1] + 1
    end
  end
end
for q, was in pairs(before) do
  wake(wakes[q])
  signal_if_better(readies[q], KEYS[17], was, q == 1 and '' or names[q])
end

if #expired == limit then out[2] = 1 end

for how, ids in pairs(ended) do
  settle_ended(w, ids, how, now)
  for _, buried in ipairs(w.buried) do out[#out + 1] = buried end
  w.buried = {}
end
local freed = redis.call('ZRANGEBYSCORE', w.freed, '-inf', '+inf', 'LIMIT', '0', ARGV[2])
for _, id in ipairs(freed) do
  local raw = redis.call('HGET', w.state, id)
  if not raw then
    redis.call('ZREM', w.freed, id)
  elseif queue_index(names, parse_state(raw).queue) then
    redis.call('ZREM', w.freed, id)
    release_dependent(w, id, now)
  end
end
settle_ended(w, {}, DEP_OK, now)

local stale = redis.call('ZRANGEBYSCORE', KEYS[9], '-inf', now, 'LIMIT', '0', ARGV[2])
if #stale > 0 then
  redis.call('HDEL', KEYS[8], unpack(stale))
  redis.call('ZREM', KEYS[9], unpack(stale))
  if #stale == limit then out[2] = 1 end
end

local spent = redis.call('ZRANGEBYSCORE', w.batchttl, '-inf', now, 'LIMIT', '0', ARGV[2])
for _, bid in ipairs(spent) do forget_batch(w, bid) end
if #spent == limit then out[2] = 1 end

local old = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', string.format('%d', now - tonumber(ARGV[3])),
  'LIMIT', '0', ARGV[2])
if #old > 0 then
  redis.call('HDEL', KEYS[10], unpack(old))
  redis.call('HDEL', KEYS[3], unpack(old))
  redis.call('HDEL', KEYS[6], unpack(old))
  redis.call('HDEL', KEYS[16], unpack(old))
  redis.call('ZREM', KEYS[5], unpack(old))
  forget_orphans(w, old)
  if #old == limit then out[2] = 1 end
end

local given_up = redis.call('ZRANGEBYSCORE', KEYS[14], '-inf', now, 'LIMIT', '0', ARGV[2])
if #given_up > 0 then
  redis.call('ZREM', KEYS[14], unpack(given_up))
  if #given_up == limit then out[2] = 1 end
end

local gone = redis.call('ZRANGEBYSCORE', KEYS[12], '-inf', string.format('%d', now - tonumber(ARGV[4])),
  'LIMIT', '0', ARGV[2])
if #gone > 0 then
  redis.call('HDEL', KEYS[13], unpack(gone))
  redis.call('ZREM', KEYS[12], unpack(gone))
end
return out
