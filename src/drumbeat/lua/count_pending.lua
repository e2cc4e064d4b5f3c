-- Counts the work still pending on one shard, atomically (a job or a schedule's run moving
-- between sets is never seen in none): `drumbeat.testing.run_until_idle` and `drumbeat worker
-- --burst` stop once it is all zero. A paused queue's work is counted apart (no worker takes it
-- until it is resumed).
-- Schedule runs waiting in due time slots: a schedule is never done, so only the runs due when
-- the caller started count (every entry of a slot due by the cutoff), and later only those made
-- due by run_now (an entry whose record's grid slot is after its slot) or back from a lapsed
-- lease (`<id>;<stalls>;...`: a run counted before); a periodic run due after the cutoff is not
-- waited for. Runs held in flight count in `busy`. `slot:<ms>` keys cannot be named here before
-- they are known, so the caller passes the slots the last reply listed; a due slot it did not
-- pass counts as one run (it is read at the next call).
--
-- KEYS[1] leases (zset)  KEYS[2] busy (hash)  KEYS[3] parking (hash)  KEYS[4] pauses (set)
-- KEYS[5] slots (zset)  KEYS[4 + 2q] ready (zset), KEYS[5 + 2q] due (zset) of the q-th queue
-- (q = 1: the default)  KEYS[5 + 2Q + i] slot:<ms> of the i-th slot passed
-- ARGV[1] window ms: entries of `due` scored at or before now + window count as pending
-- ARGV[2] the most entries read from each `due` (limiter markers among them are skipped:
--         they are no job), and the most slots listed
-- ARGV[3] Q, the number of queues  ARGV[4] the cutoff ms, -1: now (the first call), empty:
--         schedule runs are not counted (the caller runs no time slots)
-- ARGV[4 + q] the q-th queue's name ("default" for the default queue)
-- ARGV[4 + Q + i] the ms of the i-th slot passed
-- Returns {ready, due within the window, held (leases and time-slot runs), parked,
--          ms from now until the first due entry counted (-1: none), work of paused queues
--          (ready, due within the window, parked, and schedule runs while `default` is paused:
--          none of them counted before), schedule runs due, the cutoff (-1: none), then the ms
--          of the slots due by now + UPCOMING_MS, to pass at the next call}
local now = now_ms()
local horizon = tostring(now + tonumber(ARGV[1]))
local limit = ARGV[2]
local queues = tonumber(ARGV[3])
local ready, due, held, parked, first, waiting = 0, 0, 0, 0, -1, 0
held = redis.call('ZCOUNT', KEYS[1], '-inf', '(+inf')
for _, n in ipairs(redis.call('HVALS', KEYS[2])) do held = held + tonumber(n) end
local paused = paused_set(KEYS[4])
for q = 1, queues do
  local queue_ready = redis.call('ZCARD', KEYS[4 + 2 * q])
  local queue_due, queue_first = 0, -1
  local entries = redis.call('ZRANGE', KEYS[5 + 2 * q], '-inf', horizon, 'BYSCORE', 'LIMIT', '0',
                             limit, 'WITHSCORES')
  for i = 1, #entries, 2 do
    if string.sub(entries[i], 1, 2) ~= LIMIT_PREFIX then
      queue_due = queue_due + 1
      local at = math.max(0, tonumber(entries[i + 1]) - now)
      if queue_first < 0 or at < queue_first then queue_first = at end
    end
  end
  local n = tonumber(redis.call('HGET', KEYS[3], PARKED_FIELD .. ARGV[4 + q]) or '0')
  if paused[ARGV[4 + q]] then
    waiting = waiting + queue_ready + queue_due + math.max(0, n)
  else
    ready, due, parked = ready + queue_ready, due + queue_due, parked + math.max(0, n)
    if queue_first >= 0 and (first < 0 or queue_first < first) then first = queue_first end
  end
end
local out = {ready, due, held, parked, first, waiting, 0, -1}
if ARGV[4] == '' then return out end

-- The schedule runs due.
local cutoff = tonumber(ARGV[4])
if cutoff < 0 then cutoff = now end
local passed = {}
for i = 5 + queues, #ARGV do passed[ARGV[i]] = KEYS[1 + queues + i] end
local cutoff_text = string.format('%d', cutoff)
-- Slots beyond the `limit` listed count one run each.
local runs = redis.call('ZCOUNT', KEYS[5], '-inf', cutoff_text)
local listed = redis.call('ZRANGE', KEYS[5], '-inf', string.format('%d', now + UPCOMING_MS),
                          'BYSCORE', 'LIMIT', '0', limit)
for _, ms in ipairs(listed) do
  local at, key = tonumber(ms), passed[ms]
  if at <= cutoff then
    if key then runs = runs - 1 + redis.call('LLEN', key) end
  elseif at <= now then
    if not key then
      runs = runs + 1
    else
      for _, entry in ipairs(redis.call('LRANGE', key, '0', '-1')) do
        local head, grid = string.match(entry, '^([^|]*)|[^|]*|(%d+)|')
        if string.find(head or '', ';', 1, true) or tonumber(grid or '0') > at then
          runs = runs + 1
        end
      end
    end
  end
end
-- A paused default queue holds the time slots' claims.
if paused['default'] then out[6], runs = waiting + runs, 0 end
out[7], out[8] = runs, cutoff
for i, ms in ipairs(listed) do out[8 + i] = ms end
return out
