-- Shared helpers, prepended to every script by scripts.py (Redis scripts cannot include files).
-- The constants and record layouts Python reads too mirror src/drumbeat/protocol.py (same
-- names); tests/unit/test_protocol.py checks that they agree.
--
-- Per-job state lives in the `state` hash:
-- Layout (JOB_STATE_FIELDS): attempt|stalls|priority|seq|unknown|queue|dedupkey
-- Layout (SHORT_JOB_STATE_FIELDS): attempt|stalls|priority|seq|dedupkey
--   attempt   claims so far (the running attempt's number while it runs)
--   stalls    leases that expired under it (worker crashed or hung)
--   priority  0..9, higher runs first
--   seq       its place in line inside its priority level (FIFO)
--   unknown   ms when a worker that lacked its task first handed it back, or 0
--   queue     the queue it belongs to; empty for the default queue
--   dedupkey  the dedup key it holds in `uniq`, or empty
-- The short layout (every state before queues existed) is a job of the default queue never
-- handed back for want of its task: most jobs, so they keep it.
-- Owners live in the `owners` hash:
-- Layout (OWNER_FIELDS): token|worker|claimed_ms

-- 2^42: room for 4.4e12 sequence numbers per level while the score stays an exact double.
local PRIORITY_SPAN = 4398046511104
local MAX_PRIORITY = 9
local MIN_PRIORITY = 0

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Lower scores pop first, so the highest priority gets the smallest base.
local function ready_score(priority, seq)
  return (MAX_PRIORITY - priority) * PRIORITY_SPAN + seq
end

-- The priority of the best job waiting in a `ready` key, or -1 when it is empty.
local function ready_priority(ready_key)
  local head = redis.call('ZRANGE', ready_key, '0', '0', 'WITHSCORES')
  if not head[2] then return -1 end
  return MAX_PRIORITY - math.floor(tonumber(head[2]) / PRIORITY_SPAN)
end

-- Tells busy workers (on the shard's signals channel) that the best priority waiting in
-- `ready` rose above `before`, so a checkpoint of a less urgent job can lend its slot. A job of
-- the lowest priority can outrank no running job, so it is not announced (most jobs are).
-- Signals of a queue other than the default one name it (`r<priority>:<queue>`), so workers
-- that do not serve it ignore them.
local function ready_signal(best, queue)
  if queue == nil or queue == '' then return 'r' .. best end
  return 'r' .. best .. ':' .. queue
end

local function signal_if_better(ready_key, signals_key, before, queue)
  local best = ready_priority(ready_key)
  if best > before and best > MIN_PRIORITY then
    redis.call('PUBLISH', signals_key, ready_signal(best, queue))
  end
end

-- A missing or foreign state string must not break the script (one bad entry would stop every
-- claim), so it parses to defaults and the worker reports the job as malformed. The captures
-- are digits, so "x + 0" converts them: one strtod, where tonumber() runs two.
local function parse_state(s)
  if s then
    local a, st, p, q, k = string.match(s, '^(%d+)|(%d+)|(%d+)|(%d+)|(.*)$')
    if a then
      local prio = p + 0
      if prio > MAX_PRIORITY then prio = MAX_PRIORITY end
      local u, qu = 0, ''
      -- A dedup key holds no `|`: one here means the longer layout (see format_state).
      if string.find(k, '|', 1, true) then
        local u2, qu2, k2 = string.match(k, '^(%d+)|([^|]*)|(.*)$')
        if u2 then u, qu, k = u2 + 0, qu2, k2 end
      end
      return {attempt = a + 0, stalls = st + 0, priority = prio, seq = q + 0,
              unknown = u, queue = qu, key = k}
    end
  end
  return {attempt = 0, stalls = 0, priority = 0, seq = 0, unknown = 0, queue = '', key = ''}
end

-- The text of the integers 0..9, by value: most attempts, stalls and priorities are one of
-- them, and string.format calls sprintf for each field it formats (%s included).
local DIGITS = {[0] = '0', '1', '2', '3', '4', '5', '6', '7', '8', '9'}

-- A job of the default queue never handed back for want of its task (most jobs) keeps the
-- short layout, so it costs what it did before queues existed.
local function format_state(s)
  local a, st, p = DIGITS[s.attempt], DIGITS[s.stalls], DIGITS[s.priority]
  local head = (a or string.format('%d', s.attempt)) .. '|'
    .. (st or string.format('%d', s.stalls)) .. '|' .. (p or string.format('%d', s.priority))
    .. '|' .. string.format('%d', s.seq) .. '|'
  if (s.unknown or 0) == 0 and (s.queue or '') == '' then
    return head .. s.key
  end
  return head .. string.format('%d', s.unknown) .. '|' .. s.queue .. '|' .. s.key
end

-- The position of `queue` (a state's queue field: empty is the default queue) in `names`, the
-- queue names a script was given (ARGV; "default" for the default queue), or nil.
local function queue_index(names, queue)
  if queue == '' then queue = 'default' end
  for i, name in ipairs(names) do
    if name == queue then return i end
  end
  return nil
end

-- Runs `cmd key items...` once per 1,000 items rather than once per item (each redis.call costs
-- about as much as the work it does on a small hash); chunked because unpack() is limited to a
-- few thousand values. Even, so field/value and score/member pairs are never split.
local CALL_MANY_CHUNK = 1000
local function call_many(cmd, key, items)
  for i = 1, #items, CALL_MANY_CHUNK do
    redis.call(cmd, key, unpack(items, i, math.min(i + CALL_MANY_CHUNK - 1, #items)))
  end
end

-- True when `owner` (an `owners` value, or nil) records the claim with fencing token `token`.
local function holds(owner, token)
  return owner ~= nil and owner ~= false and token ~= nil
    and string.match(owner, '^(%d+)|') == token
end

-- True when `token` is the fencing token of the claim that currently owns `id`.
local function owns(owners_key, id, token)
  return holds(redis.call('HGET', owners_key, id), token)
end

-- Forgets settled claims: their owners, leases, specs and states, one call per key.
local function drop_claims(owners_key, leases_key, jobs_key, state_key, ids)
  call_many('HDEL', owners_key, ids)
  call_many('ZREM', leases_key, ids)
  call_many('HDEL', jobs_key, ids)
  call_many('HDEL', state_key, ids)
end

-- Drops the dedup key a finished job holds, unless another job has taken it since.
local function release_key(uniq_key, id, key)
  if key ~= '' and redis.call('HGET', uniq_key, key) == id then
    redis.call('HDEL', uniq_key, key)
  end
end

-- Tells `Job.result` waiters that a job finished (1) or failed for good (0): a marker every
-- waiter sees (they BLMOVE it onto the same list), kept as long as the outcome.
local function announce(done_key, marker, ttl_ms)
  redis.call('RPUSH', done_key, marker)
  redis.call('PEXPIRE', done_key, ttl_ms)
end

-- Ends a job as cancelled: forgets its record, state, progress and dedup key, and stores a
-- cancelled outcome for `ttl_ms` (`k`: uniq, jobs, state, progress, results, expires).
local function end_cancelled(k, id, s, now, ttl_ms)
  release_key(k.uniq, id, s.key)
  redis.call('HDEL', k.jobs, id)
  redis.call('HDEL', k.state, id)
  redis.call('HDEL', k.progress, id)
  if ttl_ms > 0 then
    redis.call('HSET', k.results, id, cjson.encode({ok = false, cancelled = true,
      error = 'cancelled', attempt = s.attempt, at_ms = now}))
    redis.call('ZADD', k.expires, now + ttl_ms, id)
  end
end

-- Wakes one idle worker; the marker is a single member so markers never pile up.
local function wake(wake_key)
  redis.call('ZADD', wake_key, '0', 'w')
end

-- Wakes a worker when `id` became the earliest entry of `due`, since idle workers block only
-- until the earliest due time they saw.
local function wake_if_head(due_key, wake_key, id)
  local head = redis.call('ZRANGE', due_key, '0', '0')
  if head[1] == id then wake(wake_key) end
  return head[1] == id
end

-- A schedule's run queued as a job (queue_runs.lua: its schedule is limited or routed) is
-- "s:<id>" in `ready`/`leases`/`state`, like a job, its job record "<task name>|<schedule
-- record>"; the dedupkey field of its state holds its due time, grid slot, generation, and 1 if
-- run_now moved it ahead of its grid slot (else 0), and once its lease expired (reap.lua)
-- ":<first start ms>", so its lateness counts to its first start:
-- Layout (RUN_STATE_FIELDS): due:grid:gen:manual
local RUN_PREFIX = 's:'
-- A limiter marker a claim reports steps aside this long, so other workers do not release its
-- key too (release_limits re-scores it; if the worker died, it is due again then).
local LIMIT_HOLD_MS = 1000
-- A claim reply names the slots due within this horizon (at most UPCOMING) for the worker's
-- next claim: enough for a few claim cycles at 20,000 runs/s, few at low rates.
local UPCOMING = 128
local UPCOMING_MS = 100

local function run_schedule_id(member)
  if string.sub(member, 1, 2) == RUN_PREFIX then return string.sub(member, 3) end
  return nil
end

-- A schedule's record (see schedule.py), kept under 64 bytes for a typical monitor:
-- Layout (SCHEDULE_FIELDS): gen|grid|flags|runs|failures|misfires|last_start|last_ms|late|task|spec
-- flags = priority + PAUSED_FLAG if paused; last_start is stored relative to the grid slot (a
-- few digits, not thirteen) and empty before the first run; late is how long after its due
-- time the last run started (ms; meaningful once there is a last_start); task is the task
-- name's code. `late` is never written empty: a worker of the version before it reads it as
-- the task code and the rest as the spec, and fails the run (the schedule goes on), where an
-- empty field would make the record unreadable to it and its claim would drop the schedule.
local PAUSED_FLAG = 10

-- A record written before it had `late` (one field fewer), in today's layout with `late` 0,
-- or nil when `v` is not one: such records are read as they are and upgraded when next
-- written. (Only called once the current layout did not match: its spec never starts with a
-- digit, so the two layouts cannot be mistaken for each other.)
local function schedule_of_old_layout(v)
  local head, tail = string.match(v, '^(%d+|%-?%d+|%d+|%d+|%d+|%d+|%-?%d*|%d+|)(%d+|.*)$')
  if not head then return nil end
  return head .. '0|' .. tail
end

local function parse_schedule(v)
  if not v then return nil end
  local pattern = '^(%d+)|(%-?%d+)|(%d+)|(%d+)|(%d+)|(%d+)|(%-?%d*)|(%d+)|(%d*)|(%d+)|(.*)$'
  local g, grid, flags, runs, fails, misf, rel, lm, late, task, spec = string.match(v, pattern)
  if not g then
    v = schedule_of_old_layout(v)
    if not v then return nil end
    g, grid, flags, runs, fails, misf, rel, lm, late, task, spec = string.match(v, pattern)
    if not g then return nil end
  end
  grid, flags = tonumber(grid), tonumber(flags)
  return {gen = tonumber(g), grid = grid, paused = flags >= PAUSED_FLAG,
          priority = flags % PAUSED_FLAG,
          runs = tonumber(runs), failures = tonumber(fails), misfires = tonumber(misf),
          last_start = rel == '' and 0 or grid + tonumber(rel), last_ms = tonumber(lm),
          late = late, task = task, spec = spec}
end

local function format_schedule(s)
  local rel = s.last_start > 0 and string.format('%d', s.last_start - s.grid) or ''
  return string.format('%d|%d|%d|%d|%d|%d|%s|%d|%s|%s|', s.gen, s.grid,
    s.priority + (s.paused and PAUSED_FLAG or 0), s.runs, s.failures, s.misfires, rel, s.last_ms,
    s.late, s.task) .. s.spec
end

-- Task names are interned per shard (`tasks`: name -> code, "#<code>" -> name, "#" the last
-- code), so a record holds a number instead of a dotted path. A schedule whose runs go to a
-- queue other than the default one interns the pair: "<name> <queue>" -> code (names hold no
-- space), "#<code>" -> name and "#q<code>" -> queue; so its record keeps its layout (a worker
-- of a version before queues runs such a schedule's runs in the default queue, as it did).
local ROUTE_FIELD = '#q'
local function task_code(tasks_key, name, queue)
  local interned = (queue == nil or queue == '') and name or name .. ' ' .. queue
  local code = redis.call('HGET', tasks_key, interned)
  if not code then
    code = redis.call('HINCRBY', tasks_key, '#', '1')
    if interned == name then
      redis.call('HSET', tasks_key, name, code, '#' .. code, name)
    else
      redis.call('HSET', tasks_key, interned, code, '#' .. code, name, ROUTE_FIELD .. code, queue)
    end
  end
  return tostring(code)
end

-- A claim's reply names each queue it serves that is paused ("p:<queue>", the name as
-- `App.pause_queue` was given it: "default" for the default one), so the worker's time-slot
-- lane holds schedule runs while the default queue is paused.
local PAUSE_PREFIX = 'p:'

-- The paused queues of a shard's `pauses` set (its copy), as a set of names.
local function paused_set(pauses_key)
  local paused = {}
  for _, name in ipairs(redis.call('SMEMBERS', pauses_key)) do paused[name] = true end
  return paused
end

-- Lateness histogram: a ring of LATENESS_WINDOWS windows of LATENESS_WINDOW_MS each, in one
-- hash: "w<slot>" the window number held, "b<slot>:<bin>" counts, "m<slot>" the max in ms.
-- Bin b holds lateness below 2^((b+1)/LATENESS_BINS_PER_DOUBLING) - 1 ms (about 19 % wide). A
-- slot is cleared when a new window reuses it, so the hash never grows. Besides the ring,
-- "c<bin>" and "cs" count every run since the start and sum their lateness (ms), for the
-- Prometheus histogram (counters that never go back).
local LATENESS_WINDOW_MS = 10000
local LATENESS_WINDOWS = 91
local LATENESS_BINS_PER_DOUBLING = 4
-- The highest bin: lateness_bin(2^53 ms).
local MAX_LATENESS_BIN = 212

local function lateness_bin(ms)
  return math.floor(LATENESS_BINS_PER_DOUBLING * math.log(ms + 1) / math.log(2))
end

-- Counts each of `samples` (lateness ms) once, or `weights[i]` times when given (the runs of a
-- time slot share their due time, so one sample stands for them all).
local function record_lateness(key, now, samples, weights)
  if #samples == 0 then return end
  local window = math.floor(now / LATENESS_WINDOW_MS)
  local slot = window % LATENESS_WINDOWS
  local counts, bins, max, sum = {}, {}, 0, 0
  for i, ms in ipairs(samples) do
    local bin = lateness_bin(ms)
    local w = weights and weights[i] or 1
    if not counts[bin] then counts[bin], bins[#bins + 1] = 0, bin end
    counts[bin] = counts[bin] + w
    sum = sum + ms * w
    if ms > max then max = ms end
  end
  -- One read of every field this touches and one write, not an HINCRBY per bin (two per bin:
  -- the window's and the cumulative count); only the sum keeps its HINCRBY (exact past 2^53).
  local prefix_b = 'b' .. slot .. ':'
  local fields = {'w' .. slot, 'm' .. slot}
  for _, bin in ipairs(bins) do
    fields[#fields + 1], fields[#fields + 2] = prefix_b .. bin, 'c' .. bin
  end
  local old = redis.call('HMGET', key, unpack(fields))
  local writes = {}
  local fresh = tonumber(old[1]) ~= window
  if fresh then
    -- The slot held an older window: its counts and max go (a slot is reused every
    -- LATENESS_WINDOWS windows, so the hash never grows).
    -- Named, not found by HKEYS: the ring holds thousands of fields.
    local stale = {fields[2]}
    for bin = 0, MAX_LATENESS_BIN do stale[#stale + 1] = prefix_b .. bin end
    redis.call('HDEL', key, unpack(stale))
    writes[1], writes[2] = fields[1], string.format('%d', window)
  end
  local old_max = (not fresh and tonumber(old[2])) or -1
  if max > old_max then
    writes[#writes + 1], writes[#writes + 2] = fields[2], string.format('%.0f', max)
  end
  for i, bin in ipairs(bins) do
    local in_window = (not fresh and tonumber(old[1 + 2 * i])) or 0
    -- %.0f: a count past 14 digits would otherwise reach Redis with an exponent.
    writes[#writes + 1] = fields[1 + 2 * i]
    writes[#writes + 1] = string.format('%.0f', in_window + counts[bin])
    writes[#writes + 1] = fields[2 + 2 * i]
    writes[#writes + 1] = string.format('%.0f', (tonumber(old[2 + 2 * i]) or 0) + counts[bin])
  end
  redis.call('HSET', key, unpack(writes))
  -- %.0f: a number past 17 digits would reach Redis with an exponent, which HINCRBY refuses.
  redis.call('HINCRBY', key, 'cs', string.format('%.0f', sum))
end

-- Takes back one sample `ms` that record_lateness counted at `at`: a schedule run's claim
-- counted it, but the run did not start (acquire_limits.lua parked or booked it; its next claim
-- counts it again). Its window's count goes only while the ring still holds that window; the
-- window's max stays (the run was at least that late by then).
local function unrecord_lateness(key, at, ms)
  local window = math.floor(at / LATENESS_WINDOW_MS)
  local slot = window % LATENESS_WINDOWS
  local bin = lateness_bin(ms)
  local fields = {'c' .. bin}
  if tonumber(redis.call('HGET', key, 'w' .. slot)) == window then
    fields[2] = 'b' .. slot .. ':' .. bin
  end
  for _, f in ipairs(fields) do
    if redis.call('HINCRBY', key, f, '-1') <= 0 then redis.call('HDEL', key, f) end
  end
  -- Not for 0: '%.0f' formats -0 as "-0", which HINCRBY refuses.
  if ms > 0 then redis.call('HINCRBY', key, 'cs', string.format('%.0f', -ms)) end
end

-- Takes back the lateness a schedule run's first claim counted (take_all: at attempt 1, at the
-- claim's time, kept in `owners`) when that claim is given back without an attempt spent
-- (acquire_limits parks or books it, or it is handed back): the next
-- claim is its attempt 1 again and counts it then, so a run's lateness is counted once. Call it
-- before the owner entry goes.
local function give_back_lateness(lateness_key, owners_key, id, s)
  if s.attempt ~= 1 or not run_schedule_id(id) then return end
  local owner = redis.call('HGET', owners_key, id)
  local claimed = owner and tonumber(string.match(owner, '|(%d+)$'))
  local run_due = tonumber(string.match(s.key, '^(%-?%d+):'))
  if claimed and run_due then unrecord_lateness(lateness_key, claimed, math.max(0, claimed - run_due)) end
end

-- Throughput series (tally.lua): a ring of THROUGHPUT_WINDOWS windows of THROUGHPUT_WINDOW_MS
-- each, in one hash: field "<slot>", value "<window>|<completed>|<failed>" (attempts completed;
-- attempts that raised: failed, retried or dead). Every slot is made at the first write (window
-- -1), so the hash has a fixed size; a slot starts from zero when a new window reuses it.
local THROUGHPUT_WINDOW_MS = 10000
local THROUGHPUT_WINDOWS = 91

-- `state`, `owners` and `jobs` hold an entry per job or run queued or in flight: a few hundred
-- at most times. Redis keeps a hash of up to 512 fields (hash-max-listpack-entries) with values up to
-- 64 bytes (hash-max-listpack-value) as a listpack, where every read, write and delete of a
-- field scans the whole hash, and deletes the key once its last field goes, so each burst of
-- claims rebuilt a listpack field by field: writing 600 claims' entries into such a hash cost
-- Redis 27,000 instructions an entry, against 1,600 in a hash table (`bench.redis_cpu`). A
-- value longer than a listpack takes makes Redis convert the hash at once, it never converts
-- back, and this field is never deleted, so the writes that add entries carry it first (a
-- claim's, an enqueue's, a queued run's; job ids start with a letter or digit: never "~").
local KEEP_FIELD = '~'
local KEEP_VALUE = 'drumbeat keeps this field so that Redis stores this hash as a hash table (docs/redis-keys.md)'
-- The same for `leases`: a sorted set of up to 128 members (zset-max-listpack-entries) of up
-- to 64 bytes stores them as a listpack, where each ZADD scans the set for the member, then for
-- its place among equal scores (all of a claim's leases share one deadline), and Redis deletes
-- the key once its last lease goes: so below 128 leases in flight every claim built a listpack
-- lease by lease, and writing a claim's leases was an eighth of claiming a run
-- (`bench.redis_cpu harness --whole-buckets`, callgrind). This member is longer than a listpack
-- takes and scored +inf, so no reaper (by score, up to now) ever sees it as expired; counts of
-- leases held leave it out (ZCOUNT up to "(+inf").
local LEASES_KEEP = '~drumbeat keeps this member so that Redis stores this sorted set as a skiplist (docs/redis-keys.md)'

-- Claiming, shared by claim.lua and claim_urgent.lua. `k` names the keys: state, owners,
-- leases, fence, ready, jobs. `c` is the claim: worker, now, lease_ms, and what it gathers: the
-- reply (`out`) and the lateness of each schedule run started (`lateness`).

-- Gives each of `ids` (parsed states in `states`, specs in `specs`) to the claiming worker: a
-- fresh fencing token, a lease, the attempt counted; appends each to the reply.
local function take_all(k, c, ids, specs, states)
  local n = #ids
  if n == 0 then return end
  local token = redis.call('INCRBY', k.fence, string.format('%d', n)) - n
  -- The progress each job saved at its checkpoints in an earlier attempt.
  local progress = redis.call('HMGET', k.progress, unpack(ids))
  -- What is written goes out in one call per key (see call_many), not three calls per item.
  -- Each write starts with the KEEP_FIELD of its hash (see there), and LEASES_KEEP: one call
  -- per claim keeps both hashes hash tables and `leases` a skiplist.
  local state, owners = {KEEP_FIELD, KEEP_VALUE}, {KEEP_FIELD, KEEP_VALUE}
  local leases = {'+inf', LEASES_KEEP}
  local out = c.out
  -- Numbers passed to redis.call are formatted with %.17g on the way (and scores parsed back):
  -- the lease deadline, the same for every item, is formatted once, as an integer.
  local lease_at = string.format('%d', c.now + c.lease_ms)
  -- An owner is token|worker|claimed_ms: all but the token is the same for every item
  -- (string.format would call sprintf for each of its fields, the worker's %s included).
  local owner_tail = '|' .. c.worker .. '|' .. string.format('%d', c.now)
  for i, id in ipairs(ids) do
    local s = states[i]
    s.attempt = s.attempt + 1
    state[2 * i + 1], state[2 * i + 2] = id, format_state(s)
    owners[2 * i + 1] = id
    owners[2 * i + 2] = string.format('%d', token + i) .. owner_tail
    leases[2 * i + 1], leases[2 * i + 2] = lease_at, id
    if s.attempt == 1 and string.sub(id, 1, 2) == RUN_PREFIX then
      local run_due = s.due or string.match(s.key, '^(%-?%d+):')
      if run_due then c.lateness[#c.lateness + 1] = math.max(0, c.now - run_due) end
    end
    local m = #out
    out[m + 1], out[m + 2], out[m + 3], out[m + 4] = id, specs[i], s.attempt, s.stalls
    out[m + 5], out[m + 6], out[m + 7] = token + i, s.priority, s.key
    -- Where it waits: false for the default queue when never handed back for want of its task
    -- (most jobs: nothing to send), else "<queue>|<unknown ms>".
    local where = false
    if (s.queue and s.queue ~= '') or (s.unknown and s.unknown > 0) then
      where = (s.queue or '') .. '|' .. (s.unknown or 0)
    end
    out[m + 8], out[m + 9] = progress[i] or false, where
  end
  call_many('HSET', k.state, state)
  call_many('HSET', k.owners, owners)
  call_many('ZADD', k.leases, leases)
end

-- Puts `ids` in `ready_key` (default: `k.ready`) by priority with their states (and specs, if
-- given), one call per key.
local function queue_all(k, ids, specs, states, ready_key)
  if #ids == 0 then return end
  -- Each hash written gets its KEEP_FIELD first (see there): a burst of runs queued into an
  -- empty `jobs` built a listpack that every write, read and delete then scanned (about a
  -- sixth of a run's Redis instructions when runs go through `ready`, `bench.redis_cpu`).
  local state, ready, jobs = {KEEP_FIELD, KEEP_VALUE}, {}, {KEEP_FIELD, KEEP_VALUE}
  for i, id in ipairs(ids) do
    state[2 * i + 1], state[2 * i + 2] = id, format_state(states[i])
    ready[2 * i - 1] = string.format('%d', ready_score(states[i].priority, states[i].seq))
    ready[2 * i] = id
    if specs then jobs[2 * i + 1], jobs[2 * i + 2] = id, specs[i] end
  end
  if not specs then jobs = {} end
  call_many('HSET', k.state, state)
  call_many('ZADD', ready_key or k.ready, ready)
  call_many('HSET', k.jobs, jobs)
end

-- Pops the best `limit` entries of `ready` (priority, then FIFO) and takes them. Read, then
-- removed by rank, rather than ZPOPMIN: its reply carries every score, which Redis 7.0 formats
-- with %.17g (about a microsecond each: most of a pop of 100), and only the ids are needed.
local function pop_ready(k, c, limit)
  if limit <= 0 then return end
  local last = string.format('%d', limit - 1)
  local ids = redis.call('ZRANGE', k.ready, '0', last)
  if #ids == 0 then return end
  redis.call('ZREMRANGEBYRANK', k.ready, '0', last)
  local specs = redis.call('HMGET', k.jobs, unpack(ids))
  local raw = redis.call('HMGET', k.state, unpack(ids))
  local states = {}
  for i = 1, #ids do states[i] = parse_state(raw[i]) end
  take_all(k, c, ids, specs, states)
end

-- Limits (acquire_limits.lua, release_limits.lua). A limiter key's `limit:<key>` hash holds
-- its GCRA theoretical arrival time (`tat`, ms: of the starts themselves), its booking pointer
-- (`book`, ms: the same for the starts booked ahead, which may come late) and its limit as the
-- last worker that acquired it knew it (`interval` ms between starts, 0 for no rate; `tolerance` ms; `concurrency`, 0 for
-- none), so a worker that only releases it needs no configuration. Its marker in a queue's
-- `due` is "l:<key name>".
local LIMIT_PREFIX = 'l:'
-- Lapsed permits looked at per call (each costs a lease lookup).
local LIMIT_PURGE = 16
-- A key's marker comes due at least this far ahead, so a key that can do nothing yet (its
-- parked jobs belong to queues the caller did not pass) is not looked at on every claim.
local LIMIT_RECHECK_MS = 5
-- A start the rate allows within this many ms is granted for that time: the worker waits for it
-- holding its claim (see acquire_limits.lua).
local LIMIT_NEAR_MS = 20

-- The `parking` hash of a shard counts, per queue ("default" for the default one), the jobs
-- parked on limiter keys ("p|<queue>") and the limiter markers in the queue's `due`
-- ("m|<queue>"), so status, metrics and the autoscaler read them without scanning `due` or
-- every `parked:<key>`. acquire_limits, release_limits and cancel keep them, each on the
-- reply of the ZADD / ZREM that changed what it counts.
local PARKED_FIELD = 'p|'
local MARKERS_FIELD = 'm|'
local function count_parking(key, field, queue, delta)
  if delta == 0 then return end
  if queue == nil or queue == '' then queue = 'default' end
  redis.call('HINCRBY', key, field .. queue, delta)
end

-- Reads the key's state into `l`; writes the limit given (`l.interval` set) when it changed.
local function limit_config(l)
  local raw = redis.call('HMGET', l.limit, 'tat', 'book', 'interval', 'tolerance', 'concurrency')
  l.tat, l.book = tonumber(raw[1]) or 0, tonumber(raw[2]) or 0
  if l.interval == nil then
    l.interval, l.tolerance = tonumber(raw[3]) or 0, tonumber(raw[4]) or 0
    l.concurrency = tonumber(raw[5]) or 0
  elseif l.interval ~= tonumber(raw[3]) or l.tolerance ~= tonumber(raw[4])
      or l.concurrency ~= tonumber(raw[5]) then
    redis.call('HSET', l.limit, 'interval', string.format('%.6f', l.interval),
      'tolerance', string.format('%.6f', l.tolerance), 'concurrency', l.concurrency)
  end
end

-- The permits held on the key. When they reach its concurrency, lapsed ones are looked at
-- first: renewed to their job's lease deadline while it holds a live lease, else dropped (its
-- worker crashed: the reaper requeues the job, which acquires again; or a ticket's job went
-- elsewhere).
local function permits_held(l, now)
  local n = redis.call('ZCARD', l.permits)
  if l.concurrency > 0 and n < l.concurrency then return n end
  local lapsed = redis.call('ZRANGEBYSCORE', l.permits, '-inf', now, 'LIMIT', '0', string.format('%d', LIMIT_PURGE))
  for _, m in ipairs(lapsed) do
    local lease = tonumber(redis.call('ZSCORE', l.leases, m))
    if lease and lease > now then
      redis.call('ZADD', l.permits, lease, m)
    else
      redis.call('ZREM', l.permits, m)
      n = n - 1
    end
  end
  return n
end

-- The earliest time a start can be booked on a key with a rate: after every start booked and
-- every start made (either may be ahead, when booked jobs start late).
local function booking_at(l, now)
  return math.max(now, math.max(l.book, l.tat) - l.tolerance)
end

-- When a worker should next call release_limits.lua for a key with parked jobs: when its rate
-- can book starts again (half a horizon ahead, so each call books a batch), or when its
-- earliest permit lapses (a crashed run frees its permit with its lease), whichever is first.
local function limit_attention(l, now, horizon)
  local at = nil
  if l.concurrency > 0 then
    local head = redis.call('ZRANGE', l.permits, '0', '0', 'WITHSCORES')
    at = head[2] and tonumber(head[2]) or now
  end
  if l.interval > 0 then
    local rate_at = math.max(l.book, l.tat) - l.tolerance - horizon / 2
    if at == nil or rate_at < at then at = rate_at end
  end
  return math.floor(math.max(at or now, now + LIMIT_RECHECK_MS))
end

-- Time slots (docs/design/time-slots.md), the schedule store: `slot:<ms>`
-- lists hold entries "<schedule id>|<record>" (or "<id>;<stalls>;<due>;<first start>|<record>"
-- for a run back from a lapsed lease, at the slot's end: `stalled` counts them), `where` names
-- the slot of each (for a run in flight: the slot it was claimed from), a claim's lots
-- (`claimed:<incarnation>:<n>:<ms>`) hold the entries it took from slot ms.
-- The entry of `id` in the list `slot_key`, or nil (a slot holds the schedules due in one ms:
-- a few dozen at most at a million schedules every minute, so a scan).
local function slotted_entry(slot_key, id)
  local plain, stalled = id .. '|', id .. ';'
  for _, entry in ipairs(redis.call('LRANGE', slot_key, '0', '-1')) do
    local head = string.sub(entry, 1, #plain)
    if head == plain or head == stalled then return entry end
  end
  return nil
end

-- Takes `entry` out of the slot `slot_key` (of ms `ms`), and out of the count of the runs back
-- from a lapsed lease there (`stalled_key`) if it is one.
local function unslot_entry(slot_key, ms, entry, stalled_key)
  redis.call('LREM', slot_key, '1', entry)
  if string.match(entry, '^[^|;]+;') and redis.call('HINCRBY', stalled_key, ms, '-1') <= 0 then
    redis.call('HDEL', stalled_key, ms)
  end
end

-- The record of an entry (its part after the schedule id and any stall marks), or nil.
local function entry_record(entry)
  return string.match(entry, '^[^|]*|(.*)$')
end

-- What `where` says of a paused schedule: its entry waits in `paused`, in no slot.
local PAUSED_AT = 'p'
-- What `where` says of a schedule whose run waits or runs as a job (queue_runs.lua): its
-- record is the job's (`jobs`), and its claim's token fences it, not a slot.
local QUEUED_AT = 'q'

-- The entry of `id` in the slot `where` says (`at`; its key `slot_key`), or nil: none there
-- (in flight, or queued as a job).
local function entry_at(slot_key, at, id)
  if at == QUEUED_AT or at == PAUSED_AT then return nil end
  return slotted_entry(slot_key, id)
end

-- A `pending` value split: whether a pause waits for the schedule's run in flight to settle
-- (a leading 'P'), and the change that waits with it (a definition, '-' removed; nil: none).
local function pending_parts(value)
  if not value then return false, nil end
  if string.sub(value, 1, 1) == 'P' then
    local rest = string.sub(value, 2)
    return true, rest ~= '' and rest or nil
  end
  return false, value
end

-- Writes `pending_parts`' two parts back (deletes the field when both are empty).
local function set_pending(pending_key, id, pause, change)
  local value = (pause and 'P' or '') .. (change or '')
  if value == '' then
    redis.call('HDEL', pending_key, id)
  else
    redis.call('HSET', pending_key, id, value)
  end
end

-- `entry` with its record's paused flag set (`paused`) or cleared, without any stall marks;
-- nil when its record cannot be read.
local function entry_paused(entry, paused)
  local id, record = string.match(entry, '^([^|;]+)[^|]*|(.*)$')
  local s = id and parse_schedule(record)
  if not s then return nil end
  s.paused = paused
  return id .. '|' .. format_schedule(s)
end

-- The worker's next entry for a schedule changed in flight (`change`: its definition as
-- upserted, "<due>|<grid>|<priority>|<task code>|<spec>"): true when the entry has that
-- definition (unchanged, or sent again), else the entry with it (totals and pause kept, a new
-- generation) and its due time; nil when either cannot be read.
local function with_change(entry, change)
  local due, grid, priority, task, spec =
    string.match(change, '^(%d+)|(%-?%d+)|(%d+)|(%d+)|(.*)$')
  local id, record = string.match(entry, '^([^|;]+)|(.*)$')
  local s = id and parse_schedule(record)
  if not due or not s then return nil end
  priority = priority + 0
  if s.priority == priority and s.task == task and s.spec == spec then return true end
  s.gen, s.grid, s.priority, s.task, s.spec = s.gen + 1, grid + 0, priority, task, spec
  return id .. '|' .. format_schedule(s), due
end

-- What becomes of a settled run's next `entry` given what waits for its schedule in `pending`
-- (`value`, or nil): returns the entry to push into its next slot (nil: none), the reply (1,
-- or "<due ms>|<entry>": the new definition's first slot, whose key the caller did not pass,
-- so the run stays in flight and the worker sends it again there), and whether the schedule
-- was removed. A pause waiting puts the entry in `paused`, and `where` says so.
local function settle_entry(id, entry, value, pending_key, paused_key, where_key)
  local pause, change = pending_parts(value)
  if change == '-' then return nil, 1, true end
  if change then
    local merged, due = with_change(entry, change)
    if merged == true then
      redis.call('HDEL', pending_key, id)  -- applied: the entry goes as sent
    elseif merged and pause then
      entry = merged  -- paused below: no slot to send it to
    elseif merged then
      return nil, due .. '|' .. merged, false
    end
  end
  local paused = pause and entry_paused(entry, true)
  if paused then
    redis.call('HSET', paused_key, id, paused)
    redis.call('HSET', where_key, id, PAUSED_AT)
    redis.call('HDEL', pending_key, id)
    return nil, 1, false
  end
  return entry, 1, false
end
