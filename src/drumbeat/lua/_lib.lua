-- Shared helpers, prepended to every script by scripts.py (Redis scripts cannot include files).
--
-- Per-job state lives in the `state` hash as "attempt|stalls|priority|seq|dedupkey":
--   attempt   claims so far (the running attempt's number while it runs)
--   stalls    leases that expired under it (worker crashed or hung)
--   priority  0..9, higher runs first
--   seq       its place in line inside its priority level (FIFO)
--   dedupkey  the dedup key it holds in `uniq`, or empty
-- Owners live in the `owners` hash as "token|worker|claimed_ms".

-- 2^42: room for 4.4e12 sequence numbers per level while the score stays an exact double.
local PRIORITY_SPAN = 4398046511104
local MAX_PRIORITY = 9

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Lower scores pop first, so the highest priority gets the smallest base.
local function ready_score(priority, seq)
  return (MAX_PRIORITY - priority) * PRIORITY_SPAN + seq
end

-- A missing or foreign state string must not break the script (one bad entry would stop every
-- claim), so it parses to defaults and the worker reports the job as malformed.
local function parse_state(s)
  if s then
    local a, st, p, q, k = string.match(s, '^(%d+)|(%d+)|(%d+)|(%d+)|(.*)$')
    if a then
      local prio = tonumber(p)
      if prio > MAX_PRIORITY then prio = MAX_PRIORITY end
      return {attempt = tonumber(a), stalls = tonumber(st), priority = prio, seq = tonumber(q), key = k}
    end
  end
  return {attempt = 0, stalls = 0, priority = 0, seq = 0, key = ''}
end

local function format_state(s)
  return string.format('%d|%d|%d|%d|%s', s.attempt, s.stalls, s.priority, s.seq, s.key)
end

-- True when `token` is the fencing token of the claim that currently owns `id`.
local function owns(owners_key, id, token)
  local owner = redis.call('HGET', owners_key, id)
  if not owner then return false end
  return string.match(owner, '^(%d+)|') == token
end

-- Drops the dedup key a finished job holds, unless another job has taken it since.
local function release_key(uniq_key, id, key)
  if key ~= '' and redis.call('HGET', uniq_key, key) == id then
    redis.call('HDEL', uniq_key, key)
  end
end

-- Wakes one idle worker; the marker is a single member so markers never pile up.
local function wake(wake_key)
  redis.call('ZADD', wake_key, 0, 'w')
end

-- Wakes a worker when `id` became the earliest entry of `due`, since idle workers block only
-- until the earliest due time they saw.
local function wake_if_head(due_key, wake_key, id)
  local head = redis.call('ZRANGE', due_key, 0, 0)
  if head[1] == id then wake(wake_key) end
end

-- Schedules: `schedules[id]` is "gen|grid|paused|priority|runs|failures|misfires|last_start|
-- last_ms|<spec>" (see schedule.py). Their runs go through `due`, `ready` and `leases` as the
-- member "s:<id>", with state key "<due>:<grid>:<gen>:<manual 0/1>" while in flight.
local RUN_PREFIX = 's:'

local function run_schedule_id(member)
  if string.sub(member, 1, 2) == RUN_PREFIX then return string.sub(member, 3) end
  return nil
end

local function parse_schedule(v)
  if not v then return nil end
  local g, grid, p, prio, runs, fails, misf, ls, lm, spec = string.match(v,
    '^(%d+)|(%-?%d+)|(%d)|(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|(.*)$')
  if not g then return nil end
  return {gen = tonumber(g), grid = tonumber(grid), paused = p == '1', priority = tonumber(prio),
          runs = tonumber(runs), failures = tonumber(fails), misfires = tonumber(misf),
          last_start = tonumber(ls), last_ms = tonumber(lm), spec = spec}
end

local function format_schedule(s)
  return string.format('%d|%d|%d|%d|%d|%d|%d|%d|%d|', s.gen, s.grid, s.paused and 1 or 0,
    s.priority, s.runs, s.failures, s.misfires, s.last_start, s.last_ms) .. s.spec
end

-- True while the schedule's run is queued or in flight: it must not be in `due` then.
local function run_in_flight(ready_key, leases_key, member)
  return redis.call('ZSCORE', leases_key, member) or redis.call('ZSCORE', ready_key, member)
end

-- Lateness histogram: a ring of LATENESS_WINDOWS windows of LATENESS_WINDOW_MS each, in one
-- hash: "w<slot>" the window number held, "b<slot>:<bin>" counts, "m<slot>" the max in ms.
-- Bin b holds lateness below 2^((b+1)/4) - 1 ms (about 19 % wide). A slot is cleared when a new
-- window reuses it, so the hash never grows.
local LATENESS_WINDOW_MS = 10000
local LATENESS_WINDOWS = 7

local function record_lateness(key, now, samples)
  if #samples == 0 then return end
  local window = math.floor(now / LATENESS_WINDOW_MS)
  local slot = window % LATENESS_WINDOWS
  local held = tonumber(redis.call('HGET', key, 'w' .. slot))
  if held ~= window then
    local fields = redis.call('HKEYS', key)
    local prefix_b, prefix_m = 'b' .. slot .. ':', 'm' .. slot
    local stale = {}
    for _, f in ipairs(fields) do
      if string.sub(f, 1, #prefix_b) == prefix_b or f == prefix_m then stale[#stale + 1] = f end
    end
    if #stale > 0 then redis.call('HDEL', key, unpack(stale)) end
    redis.call('HSET', key, 'w' .. slot, window)
  end
  local counts, max = {}, 0
  for _, ms in ipairs(samples) do
    local bin = math.floor(4 * math.log(ms + 1) / math.log(2))
    counts[bin] = (counts[bin] or 0) + 1
    if ms > max then max = ms end
  end
  for bin, c in pairs(counts) do redis.call('HINCRBY', key, 'b' .. slot .. ':' .. bin, c) end
  local old_max = tonumber(redis.call('HGET', key, 'm' .. slot)) or -1
  if max > old_max then redis.call('HSET', key, 'm' .. slot, max) end
end
