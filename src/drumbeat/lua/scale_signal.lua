-- Reads what the autoscaler sizes worker pools on, in one read-only call: the backlog per
-- priority, what is due but not yet promoted (schedule lag), the busy slots, the lateness ring,
-- and (on the namespace's main shard) the live workers and supervisors. Jobs parked on limiter
-- keys are no backlog (a limit holds them, not a lack of workers): they wait in no `ready` and
-- no `due`, and the limiter markers "l:<key>" in a `due` are not counted as due entries, nor
-- as the oldest one. A `due` that holds markers (its `parking` count, m|<queue>) is read entry
-- by entry up to SIGNAL_SCAN entries due; a marker beyond those would count (a backlog of
-- thousands due is one anyway). A paused queue's jobs (in this shard's copy of `pauses`) are no
-- backlog either: no worker takes them until it is resumed, so more workers would not help.
-- They are counted apart; while the default queue is paused, so are the runs due in the time
-- slots (schedules are the default queue's).
--
-- KEYS[1] leases (zset)  KEYS[2] lateness (hash)  KEYS[3] workers (zset)
-- KEYS[4] workerinfo (hash)  KEYS[5] supervisors (zset)  KEYS[6] supervisorinfo (hash)
-- KEYS[7] parking (hash)  KEYS[8] slots (zset: the time slots' non-empty slots)  KEYS[9] busy
-- (hash: the time-slot runs each worker process incarnation holds, which hold no lease)
-- KEYS[10] where (hash: every schedule the time slots keep)  KEYS[11] paused (hash: the paused
-- schedules)  KEYS[12] pauses (set: the paused queues, this shard's copy)
-- KEYS[11 + 2q] ready (zset), KEYS[12 + 2q] due (zset) of the q-th queue counted
-- ARGV[1] worker ttl ms  ARGV[2] 1: read the registrations too
-- ARGV[3] lateness windows to read (the latest ones)
-- ARGV[3 + q] the q-th queue's name ("default" for the default one)
-- Returns {now ms, {ready count at priority 0, ..., at priority 9}, entries of `due` at or
--          before now (limiter markers left out) plus the schedule runs due in the time slots,
--          the earliest of their scores, else the earliest `due` score, or -1, leases and
--          time-slot runs held, {lateness of the windows read: field, value, ... as HGETALL
--          gives them, of the fields that exist}, {worker id, info, ...} of workers beating
--          within the ttl, {supervisor id, expiry ms, info, ...} of supervisors whose
--          registration holds, the schedule runs due in the time slots, the jobs of paused
--          queues (ready, and due entries at or before now) and, while the default one is
--          paused, the runs due in the time slots: none of them counted before}
-- (ready and due summed over the queues). The runs due in the time slots are estimated: the due
-- slots times the runs a slot holds on average (the schedules waiting in a slot, over the
-- slots), at least one each; exact when every slot is due (a cold start). Counting them
-- exactly would read every due slot, whose keys a script cannot name before it runs.
local SIGNAL_SCAN = 1000
local now = now_ms()
local counts = {}
for p = 0, MAX_PRIORITY do counts[p + 1] = 0 end
local due_now, earliest = 0, -1
local function seen_due(score)
  if score and (earliest < 0 or score < earliest) then earliest = score end
end
-- The entries of `due` at or before now, limiter markers left out, and the earliest score of
-- the others (or of the next entry after now when only markers are due), or nil.
local function count_due(due, name)
  local n = redis.call('ZCOUNT', due, '-inf', now)
  local markers = tonumber(redis.call('HGET', KEYS[7], MARKERS_FIELD .. name)) or 0
  if markers == 0 or n == 0 then
    local head = redis.call('ZRANGE', due, '0', '0', 'WITHSCORES')
    return n, head[2] and tonumber(head[2])
  end
  local first = nil
  local entries = redis.call('ZRANGEBYSCORE', due, '-inf', now, 'WITHSCORES', 'LIMIT', '0',
    string.format('%d', SIGNAL_SCAN))
  for j = 1, #entries, 2 do
    if string.sub(entries[j], 1, 2) == LIMIT_PREFIX then
      n = n - 1
    elseif first == nil then
      first = tonumber(entries[j + 1])
    end
  end
  if first == nil then  -- only markers are due: the next entry after now, if any
    local after = redis.call('ZRANGEBYSCORE', due, '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', '0', '1')
    first = after[2] and tonumber(after[2])
  end
  return n, first
end
local paused = paused_set(KEYS[12])
local held_paused = 0
for q = 1, (#KEYS - 12) / 2 do
  local ready, due, name = KEYS[11 + 2 * q], KEYS[12 + 2 * q], ARGV[3 + q]
  local n, first = count_due(due, name)
  if paused[name] then
    held_paused = held_paused + redis.call('ZCARD', ready) + n
  else
    for p = 0, MAX_PRIORITY do
      local base = ready_score(p, 0)
      counts[p + 1] = counts[p + 1] + redis.call('ZCOUNT', ready, string.format('%.0f', base),
        '(' .. string.format('%.0f', base + PRIORITY_SPAN))
    end
    due_now = due_now + n
    seen_due(first)
  end
end
local busy, slot_runs = redis.call('ZCOUNT', KEYS[1], '-inf', '(+inf'), 0  -- not LEASES_KEEP
for _, held in ipairs(redis.call('HVALS', KEYS[9])) do
  slot_runs = slot_runs + math.max(0, tonumber(held) or 0)
end
busy = busy + slot_runs
local due_slots, due_runs = redis.call('ZCOUNT', KEYS[8], '-inf', now), 0
if due_slots > 0 then
  local waiting = redis.call('HLEN', KEYS[10]) - redis.call('HLEN', KEYS[11]) - slot_runs
  due_runs = math.max(due_slots,
    math.floor(due_slots * waiting / redis.call('ZCARD', KEYS[8]) + 0.5))
end
if paused['default'] then  -- the time-slot lane holds its claims: the runs wait
  held_paused, due_runs = held_paused + due_runs, 0
else
  due_now = due_now + due_runs
  local slot_head = redis.call('ZRANGE', KEYS[8], '0', '0', 'WITHSCORES')
  seen_due(slot_head[2] and tonumber(slot_head[2]))
end
-- Only the windows asked for: the ring holds LATENESS_WINDOWS of them (thousands of fields), and
-- a look every scale_interval must not cost Redis a read of them all.
local lateness, fields = {}, {}
local window = math.floor(now / LATENESS_WINDOW_MS)
for w = window - tonumber(ARGV[3]) + 1, window do
  local slot = w % LATENESS_WINDOWS
  fields[#fields + 1], fields[#fields + 2] = 'w' .. slot, 'm' .. slot
  for bin = 0, MAX_LATENESS_BIN do fields[#fields + 1] = 'b' .. slot .. ':' .. bin end
end
local values = redis.call('HMGET', KEYS[2], unpack(fields))
for i, value in ipairs(values) do
  if value then lateness[#lateness + 1], lateness[#lateness + 2] = fields[i], value end
end
local workers, supervisors = {}, {}
if ARGV[2] == '1' then
  local ids = redis.call('ZRANGEBYSCORE', KEYS[3], now - tonumber(ARGV[1]), '+inf')
  for _, id in ipairs(ids) do
    workers[#workers + 1] = id
    workers[#workers + 1] = redis.call('HGET', KEYS[4], id) or ''
  end
  local sups = redis.call('ZRANGEBYSCORE', KEYS[5], now, '+inf', 'WITHSCORES')
  for i = 1, #sups, 2 do
    supervisors[#supervisors + 1] = sups[i]
    supervisors[#supervisors + 1] = sups[i + 1]
    supervisors[#supervisors + 1] = redis.call('HGET', KEYS[6], sups[i]) or ''
  end
end
return {now, counts, due_now, earliest, busy, lateness, workers, supervisors, due_runs,
        held_paused}
