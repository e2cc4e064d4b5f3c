-- Claims up to `limit` runnable items of the queues a worker serves for it: promotes what is
-- due (delayed jobs and retries) in each served queue, takes the best of their `ready` keys by
-- priority, then enqueue order, across queues (see pop_queues), and gives each a lease and a
-- fresh fencing token. Takes the due runs of the schedule buckets the worker passed (those that
-- headed `due` at its last call, see upcoming_markers) and re-scores their markers that are
-- due (opening only those, when it read every due marker); reports other due buckets, whose
-- keys it cannot name, for promote_runs.lua (as many as it has slots left), and the due
-- markers of limiter keys ("l:<key name>", whose keys it cannot name either), for
-- release_limits.lua; both step aside for BUCKET_HOLD_MS. Records the
-- lateness of every schedule run it starts. Schedules are kept by the default queue: their
-- markers live in its `due`, and buckets are passed only when it is the first queue served; a
-- run of a schedule routed to another queue goes to that queue's `ready` (its keys among the
-- served queues' or the other queues passed), or stays in its bucket, reported "q:<queue>".
-- A paused queue (in `pauses`) is not claimed from: its due jobs still move into its `ready`,
-- where they wait, but nothing is popped, its wake key is not re-armed and its due times do
-- not bound the worker's wait (so an idle worker does not spin on it); while the default
-- queue is paused no schedule bucket is opened or reported. The reply names each served queue
-- that is paused ("p:<queue>"), so the worker's time-slot lane holds its claims too.
--
-- KEYS[1] jobs (hash)    KEYS[2] state (hash)   KEYS[3] owners (hash)   KEYS[4] leases (zset)
-- KEYS[5] fence (string) KEYS[6] seq (string)   KEYS[7] lateness (hash) KEYS[8] tasks (hash)
-- KEYS[9] progress (hash) KEYS[10] pauses (set: the paused queues, this shard's copy)
-- KEYS[8 + 3q] ready, KEYS[9 + 3q] due, KEYS[10 + 3q] wake (zsets) of the q-th served queue
-- KEYS[9 + 3n + 2r] ready, KEYS[10 + 3n + 2r] wake of the r-th other queue schedule runs may
--          go to (m of them)
-- KEYS[9 + 3n + 2m + 2i] wheel:<b> (zset), KEYS[10 + 3n + 2m + 2i] schedules:<b> (hash) of the
--          i-th passed bucket
-- ARGV[1] worker id   ARGV[2] limit   ARGV[3] lease_ms   ARGV[4] most due entries to read
-- ARGV[5] number of served queues (n)   ARGV[6] number of other queues (m)
-- ARGV[7] most upcoming markers wanted (0: none, see upcoming_markers)
-- ARGV[7 + q] the q-th served queue's name, then ARGV[7 + n + r] the r-th other queue's
-- ARGV[7 + n + m + i] the i-th passed bucket number
-- Returns {now_ms, next_due_ms or -1, {due bucket numbers to promote, due limiter markers
--          "l:<key name>", and the served queues paused, "p:<queue>"}, {{upcoming markers due
--          already}, {later ones, each followed by its ms}} (markers "w:<bucket>" or
--          "l:<key name>") or false when none were wanted (nor while the default queue is
--          paused), priority of the best job left in the served `ready` keys not paused or
--          -1, then per item: id, spec or false, attempt, stalls, token, priority, extra, saved progress or
--          false, then false or "<queue ('' for the default one)>|<ms it was first handed back
--          for want of its task, or 0>" (false: the default queue, never handed back)}; for a
--          schedule run the id is "s:<schedule id>", the spec "<task name>|<arguments and
--          cadence>" and extra "<due>:<grid>:<generation>:<manual>"

-- (Defined here, not in _lib.lua: every script runs all of _lib's definitions on every call.)
-- Pops the best `limit` entries across several `ready` keys and takes them: the lowest scores
-- first, whichever queue holds them. A score is (9 - priority) * 2^42 + seq with one `seq` per
-- shard, so it orders by priority, then by enqueue order, across queues too. The entries taken
-- from one queue are a prefix of it, so each queue is read once and popped once.
local function pop_queues(k, c, ready_keys, limit)
  if #ready_keys == 1 then
    k.ready = ready_keys[1]
    return pop_ready(k, c, limit)
  end
  if limit <= 0 then return end
  local heads = {}
  for q, key in ipairs(ready_keys) do
    local head = redis.call('ZRANGE', key, '0', string.format('%d', limit - 1), 'WITHSCORES')
    for j = 1, #head, 2 do heads[#heads + 1] = {tonumber(head[j + 1]), q, head[j]} end
  end
  if #heads == 0 then return end
  table.sort(heads, function(a, b)
    if a[1] ~= b[1] then return a[1] < b[1] end
    return a[2] < b[2]
  end)
  local ids, taken = {}, {}
  for i = 1, math.min(limit, #heads) do
    ids[i] = heads[i][3]
    taken[heads[i][2]] = (taken[heads[i][2]] or 0) + 1
  end
  -- By rank, not ZPOPMIN: the scores were read above (see pop_ready).
  for q, n in pairs(taken) do
    redis.call('ZREMRANGEBYRANK', ready_keys[q], '0', string.format('%d', n - 1))
  end
  local specs = redis.call('HMGET', k.jobs, unpack(ids))
  local raw = redis.call('HMGET', k.state, unpack(ids))
  local states = {}
  for i = 1, #ids do states[i] = parse_state(raw[i]) end
  take_all(k, c, ids, specs, states)
end

local now = now_ms()
local limit = tonumber(ARGV[2])
local nq, nr = tonumber(ARGV[5]), tonumber(ARGV[6])
local queues, readies, buckets = {}, {}, {}
local routes = routes_from(nr, 8 + nq, 11 + 3 * nq)
-- One read of the shard's copy of `pauses` per claim (a set of a few names, mostly empty).
local paused = paused_set(KEYS[10])
for q = 1, nq do
  local name = ARGV[7 + q]
  if name == '' then name = 'default' end
  queues[q] = {ready = KEYS[8 + 3 * q], due = KEYS[9 + 3 * q], wake = KEYS[10 + 3 * q],
               paused = paused[name]}
  if paused[name] then
    buckets[#buckets + 1] = PAUSE_PREFIX .. name
  else
    readies[#readies + 1] = queues[q].ready
  end
  routes[ARGV[7 + q]] = queues[q]
end
local k = {ready = queues[1].ready, jobs = KEYS[1], state = KEYS[2], owners = KEYS[3],
           leases = KEYS[4], fence = KEYS[5], seq = KEYS[6], tasks = KEYS[8],
           due = queues[1].due, progress = KEYS[9], routes = routes}
local c = {worker = ARGV[1], now = now, lease_ms = tonumber(ARGV[3]),
           out = {now, -1, buckets, {}, -1}, lateness = {}}
local passed, is_passed = {}, {}
local before_buckets, before_args = 9 + 3 * nq + 2 * nr, 7 + nq + nr
for i = 1, #ARGV - before_args do
  local b = ARGV[before_args + i]
  passed[i] = {b, KEYS[before_buckets + 2 * i], KEYS[before_buckets + 2 * i + 1]}
  is_passed[b] = true
end
local passed_due = {}
-- Due buckets it cannot open, reported after the claim took what it could (see below).
local reportable = {}
-- Numbers passed to redis.call as strings, formatted once: Redis formats a number argument
-- with %.17g (a few thousand instructions each; an empty claim passed about ten).
local hold_until = string.format('%d', now + BUCKET_HOLD_MS)
local now_text = string.format('%d', now)
-- Due entries read per queue: one more than the slots (each entry is at least one job or run;
-- the one more sends a burst of due jobs through `ready`, where priority decides), at most
-- ARGV[4]; a busy worker (no slots) reads ARGV[4] and reports every due bucket read. Due
-- buckets a claim cannot open stay due: reading more of them only to leave them cost each
-- claim a pass over hundreds under a backlog (a third of Redis's CPU per run).
local read = ARGV[4]
if limit > 0 and limit + 1 < tonumber(ARGV[4]) then read = string.format('%d', limit + 1) end
local direct = false
-- Whether the read of the first queue's `due` (where bucket markers live) gave every due entry.
local read_all = true
for q, queue in ipairs(queues) do
  local due = redis.call('ZRANGEBYSCORE', queue.due, '-inf', now_text, 'LIMIT', '0', read)
  if q == 1 then read_all = #due < tonumber(read) end
  local members, held = {}, {}
  for _, member in ipairs(due) do
    local prefix = string.sub(member, 1, 2)
    if prefix == WHEEL_PREFIX then
      local bucket = string.sub(member, 3)
      if queue.paused then  -- schedules are the default queue's: its runs wait in the buckets
      elseif is_passed[bucket] then  -- its runs are taken below, and its marker re-scored
        passed_due[bucket] = true
      else
        reportable[#reportable + 1] = {queue.due, member, bucket}
      end
    elseif prefix == LIMIT_PREFIX then  -- reported whole, for release_limits.lua
      buckets[#buckets + 1] = member
      held[#held + 1] = hold_until
      held[#held + 1] = member
    else
      members[#members + 1] = member
    end
  end
  if #held > 0 then redis.call('ZADD', queue.due, unpack(held)) end
  -- When everything due fits in this worker's free slots and nothing else waits, it is claimed
  -- straight from `due`: the same result as promote-then-pop, without the detour through
  -- `ready` (one queue only: across queues, pop_queues decides the order).
  direct = nq == 1 and not queue.paused and #members > 0 and #members <= limit
    and redis.call('ZCARD', queue.ready) == 0
  if #members > 0 then
    local raw = redis.call('HMGET', KEYS[2], unpack(members))
    local seq = redis.call('INCRBY', KEYS[6], string.format('%d', #members)) - #members
    local states = {}
    for i = 1, #members do
      states[i] = parse_state(raw[i])
      states[i].seq = seq + i
    end
    redis.call('ZREM', queue.due, unpack(members))
    if direct then
      take_all(k, c, members, redis.call('HMGET', KEYS[1], unpack(members)), states)
    else
      queue_all(k, members, nil, states, queue.ready)
    end
  end
end
if not direct then pop_queues(k, c, readies, limit) end
-- A passed bucket whose marker is not due holds no due run (a marker is at or before its
-- bucket's earliest due time), so when the read gave every due marker it is not opened: the
-- worker passes buckets due a little after it sends the claim, and opening one early cost a
-- read of the bucket for nothing. The worker keeps it in its list for its next claim.
if queues[1].paused then
  passed = {}
elseif read_all and #passed > 0 then
  local due_now = {}
  for _, b in ipairs(passed) do
    if passed_due[b[1]] then due_now[#due_now + 1] = b end
  end
  passed = due_now
end
local early = #passed > 0
  and promote_buckets(k, c, passed, limit - (#c.out - 5) / 9, passed_due)
-- The due buckets it could not open are reported for promote_runs.lua, stepped aside for
-- BUCKET_HOLD_MS, as many as the slots left (each holds a due run; with `limit` 0, all: a busy
-- worker promotes them for its checkpoints); the rest stay due for other workers' claims.
local room, held_by_key = limit - (#c.out - 5) / 9, {}
for i, marker in ipairs(reportable) do
  if limit > 0 and i > room then
    early = true
    break
  end
  buckets[#buckets + 1] = marker[3]
  local held = held_by_key[marker[1]]
  if not held then held = {}; held_by_key[marker[1]] = held end
  held[#held + 1], held[#held + 2] = hold_until, marker[2]
end
for due_key, held in pairs(held_by_key) do redis.call('ZADD', due_key, unpack(held)) end
record_lateness(KEYS[7], now, c.lateness)

-- One marker woke this worker; pass it on so work left behind does not wait for a timeout.
local next_due = nil
-- A paused queue's work neither wakes workers nor bounds their wait: they would claim at once
-- and find nothing to take, again and again (resume_queue.lua wakes them).
if nq == 1 then
  if not queues[1].paused then
    c.out[5] = ready_priority(queues[1].ready)
    if early or c.out[5] >= 0 then wake(queues[1].wake) end
    local head = redis.call('ZRANGE', queues[1].due, '0', '0', 'WITHSCORES')
    if head[2] then next_due = tonumber(head[2]) end
  end
else
  for q, queue in ipairs(queues) do
    if not queue.paused then
      local p = ready_priority(queue.ready)
      if p > c.out[5] then c.out[5] = p end
      if p >= 0 or (early and q == 1) then wake(queue.wake) end
      local head = redis.call('ZRANGE', queue.due, '0', '0', 'WITHSCORES')
      if head[2] and (next_due == nil or tonumber(head[2]) < next_due) then
        next_due = tonumber(head[2])
      end
    end
  end
end
if next_due then c.out[2] = next_due end
c.out[4] = upcoming_markers(queues[1].due, now, queues[1].paused and 0 or tonumber(ARGV[7]))
return c.out
