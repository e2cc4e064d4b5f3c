-- Claims up to `limit` runnable items of the queues a worker serves for it: promotes what is
-- due (delayed jobs and retries) in each served queue, takes the best of their `ready` keys by
-- priority, then enqueue order, across queues (see pop_queues), and gives each a lease and a
-- fresh fencing token. Reports the due markers of limiter keys ("l:<key name>", whose keys it
-- cannot name), for release_limits.lua, stepped aside for LIMIT_HOLD_MS. Records the lateness
-- of every schedule run it starts (a run of a limited or routed schedule, queued as a job).
-- A paused queue (in `pauses`) is not claimed from: its due jobs still move into its `ready`,
-- where they wait, but nothing is popped, its wake key is not re-armed and its due times do
-- not bound the worker's wait (so an idle worker does not spin on it). The reply names each
-- served queue that is paused ("p:<queue>"), so the worker's time-slot lane holds its claims
-- while the default queue (schedules are its) is paused.
--
-- KEYS[1] jobs (hash)    KEYS[2] state (hash)   KEYS[3] owners (hash)   KEYS[4] leases (zset)
-- KEYS[5] fence (string) KEYS[6] seq (string)   KEYS[7] lateness (hash) KEYS[8] progress (hash)
-- KEYS[9] pauses (set: the paused queues, this shard's copy)
-- KEYS[7 + 3q] ready, KEYS[8 + 3q] due, KEYS[9 + 3q] wake (zsets) of the q-th served queue
-- ARGV[1] worker id   ARGV[2] limit   ARGV[3] lease_ms   ARGV[4] most due entries to read
-- ARGV[5] number of served queues (n)   ARGV[5 + q] the q-th served queue's name
-- Returns {now_ms, next_due_ms or -1, {due limiter markers "l:<key name>", and the served
--          queues paused, "p:<queue>"}, priority of the best job left in the served `ready`
--          keys not paused or -1, then per item: id, spec or false, attempt, stalls, token,
--          priority, extra, saved progress or false, then false or "<queue ('' for the default
--          one)>|<ms it was first handed back for want of its task, or 0>" (false: the default
--          queue, never handed back)}; for a schedule's run the id is "s:<schedule id>", the
--          spec "<task name>|<schedule record>" and extra "<due>:<grid>:<generation>:<manual>"

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
local nq = tonumber(ARGV[5])
local queues, readies, reports = {}, {}, {}
-- One read of the shard's copy of `pauses` per claim (a set of a few names, mostly empty).
local paused = paused_set(KEYS[9])
for q = 1, nq do
  local name = ARGV[5 + q]
  if name == '' then name = 'default' end
  queues[q] = {ready = KEYS[7 + 3 * q], due = KEYS[8 + 3 * q], wake = KEYS[9 + 3 * q],
               paused = paused[name]}
  if paused[name] then
    reports[#reports + 1] = PAUSE_PREFIX .. name
  else
    readies[#readies + 1] = queues[q].ready
  end
end
local k = {ready = queues[1].ready, jobs = KEYS[1], state = KEYS[2], owners = KEYS[3],
           leases = KEYS[4], fence = KEYS[5], seq = KEYS[6], due = queues[1].due,
           progress = KEYS[8]}
local c = {worker = ARGV[1], now = now, lease_ms = tonumber(ARGV[3]),
           out = {now, -1, reports, -1}, lateness = {}}
-- Numbers passed to redis.call as strings, formatted once: Redis formats a number argument
-- with %.17g (a few thousand instructions each; an empty claim passed about ten).
local hold_until = string.format('%d', now + LIMIT_HOLD_MS)
local now_text = string.format('%d', now)
-- Due entries read per queue: one more than the slots (each entry is at least one job; the one
-- more sends a burst of due jobs through `ready`, where priority decides), at most ARGV[4].
local read = ARGV[4]
if limit > 0 and limit + 1 < tonumber(ARGV[4]) then read = string.format('%d', limit + 1) end
local direct = false
for _, queue in ipairs(queues) do
  local due = redis.call('ZRANGEBYSCORE', queue.due, '-inf', now_text, 'LIMIT', '0', read)
  local members, held = {}, {}
  for _, member in ipairs(due) do
    if string.sub(member, 1, 2) == LIMIT_PREFIX then  -- reported whole, for release_limits.lua
      reports[#reports + 1] = member
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
record_lateness(KEYS[7], now, c.lateness)

-- One marker woke this worker; pass it on so work left behind does not wait for a timeout.
-- A paused queue's work neither wakes workers nor bounds their wait: they would claim at once
-- and find nothing to take, again and again (resume_queue.lua wakes them).
local next_due = nil
for _, queue in ipairs(queues) do
  if not queue.paused then
    local p = ready_priority(queue.ready)
    if p > c.out[4] then c.out[4] = p end
    if p >= 0 then wake(queue.wake) end
    local head = redis.call('ZRANGE', queue.due, '0', '0', 'WITHSCORES')
    if head[2] and (next_due == nil or tonumber(head[2]) < next_due) then
      next_due = tonumber(head[2])
    end
  end
end
if next_due then c.out[2] = next_due end
return c.out
