-- Takes the due runs out of some schedule buckets (a claim reported the buckets; it cannot open
-- them itself, since their keys were not known before it ran) and claims up to `limit` runs for
-- this worker: straight from the buckets when nothing waits in `ready` (the same result as
-- queue-then-pop, without the detour), else through `ready`, where priority decides; the rest
-- wait there for any worker. Each run gets its state (due time, grid slot, generation), so from
-- here on it is leased, fenced, reaped and claimed like a job. A schedule is out of its bucket
-- while its run is queued or in flight, so it cannot run twice at once. Each bucket's marker in
-- `due` is re-scored at its new earliest due time.
--
-- KEYS[1] due (zset)     KEYS[2] ready (zset)   KEYS[3] jobs (hash)    KEYS[4] state (hash)
-- KEYS[5] seq (string)   KEYS[6] wake (zset)    KEYS[7] tasks (hash)   KEYS[8] owners (hash)
-- KEYS[9] leases (zset)  KEYS[10] fence (string) KEYS[11] lateness (hash)
-- KEYS[10 + 2i] wheel:<b> (zset), KEYS[11 + 2i] schedules:<b> (hash) of the i-th bucket
-- ARGV[1] worker id  ARGV[2] limit  ARGV[3] lease_ms  ARGV[3 + i] the i-th bucket number
-- Returns what claim.lua returns, with no buckets: {now_ms, next_due_ms or -1, {}, items...}
local now = now_ms()
local limit = tonumber(ARGV[2])
local k = {ready = KEYS[2], jobs = KEYS[3], state = KEYS[4], owners = KEYS[8],
           leases = KEYS[9], fence = KEYS[10]}
local c = {worker = ARGV[1], now = now, lease_ms = tonumber(ARGV[3]), out = {now, -1, {}},
           lateness = {}}
local names = {}

local function task_name(code)
  if names[code] == nil then names[code] = redis.call('HGET', KEYS[7], '#' .. code) or '?' end
  return names[code]
end

-- Every due run of the given buckets, out of its bucket. `early`: a marker now comes due
-- before the hold other workers saw when the claim reported it, so they must look again.
local ids, specs, states = {}, {}, {}
local early = false
for i = 1, #ARGV - 3 do
  local bucket = ARGV[3 + i]
  local wheel_key, schedules_key = KEYS[10 + 2 * i], KEYS[11 + 2 * i]
  local due = redis.call('ZRANGEBYSCORE', wheel_key, '-inf', now, 'WITHSCORES')
  if #due > 0 then
    local found = {}
    for j = 1, #due, 2 do found[#found + 1] = due[j] end
    local records = redis.call('HMGET', schedules_key, unpack(found))
    for j, id in ipairs(found) do
      local s = parse_schedule(records[j])
      if s and not s.paused then
        ids[#ids + 1] = RUN_PREFIX .. id
        specs[#ids] = task_name(s.task) .. '|' .. s.spec
        states[#ids] = {attempt = 0, stalls = 0, priority = s.priority, seq = 0,
                        key = string.format('%d:%d:%d:0', tonumber(due[j * 2]), s.grid, s.gen)}
      end
    end
    redis.call('ZREM', wheel_key, unpack(found))
  end
  local next_due = wheel_settle(KEYS[1], wheel_key, bucket)
  if next_due and next_due < now + BUCKET_HOLD_MS then early = true end
end

if #ids > 0 then
  local seq = redis.call('INCRBY', KEYS[5], #ids) - #ids
  for i = 1, #ids do states[i].seq = seq + i end
  if redis.call('ZCARD', KEYS[2]) == 0 then
    -- Nothing else waits: the best `limit` runs (priority, then order) are taken at once, the
    -- same result as queue-then-pop; only the rest are queued, with a copy of their spec for
    -- whoever claims them (a run taken here has none: see Worker._fill_run_specs).
    local order = {}
    for i = 1, #ids do order[i] = i end
    table.sort(order, function(a, b)
      if states[a].priority ~= states[b].priority then
        return states[a].priority > states[b].priority
      end
      return a < b
    end)
    local take = {{}, {}, {}}
    local rest = {{}, {}, {}}
    for n, i in ipairs(order) do
      local into = n <= limit and take or rest
      local m = #into[1] + 1
      into[1][m], into[2][m], into[3][m] = ids[i], specs[i], states[i]
    end
    take_all(k, c, take[1], take[2], take[3])
    queue_all(k, rest[1], rest[2], rest[3])
  else
    queue_all(k, ids, specs, states)
    pop_ready(k, c, limit)
  end
  record_lateness(KEYS[11], now, c.lateness)
  if redis.call('ZCARD', KEYS[2]) > 0 then early = true end
end
if early then wake(KEYS[6]) end
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if head[2] then c.out[2] = tonumber(head[2]) end
return c.out
