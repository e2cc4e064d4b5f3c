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
