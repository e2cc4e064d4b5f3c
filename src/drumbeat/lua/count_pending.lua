-- Counts the work still pending on one shard, atomically (a job moving between sets is never
-- seen in none): `drumbeat.testing.run_until_idle` and `drumbeat worker --burst` stop once it
-- is all zero. Waiting schedules are not pending; their runs are, once ready, due or held. Nor
-- is the work of a paused queue (no worker takes it until it is resumed): it is counted apart.
--
-- KEYS[1] leases (zset)  KEYS[2] busy (hash)  KEYS[3] parking (hash)  KEYS[4] pauses (set)
-- KEYS[3 + 2q] ready (zset), KEYS[4 + 2q] due (zset) of the q-th queue (q = 1: the default)
-- ARGV[1] window ms: entries of `due` scored at or before now + window count as pending
-- ARGV[2] the most entries read from each `due` (limiter markers among them are skipped:
--         they are no job)
-- ARGV[2 + q] the q-th queue's name ("default" for the default queue)
-- Returns {ready, due within the window, held (leases and time-slot runs), parked,
--          ms from now until the first due entry counted (-1: none), jobs of paused queues
--          (ready, due within the window or parked: none of them counted before)}
local now = now_ms()
local horizon = tostring(now + tonumber(ARGV[1]))
local limit = ARGV[2]
local ready, due, held, parked, first, waiting = 0, 0, 0, 0, -1, 0
held = redis.call('ZCOUNT', KEYS[1], '-inf', '(+inf')
for _, n in ipairs(redis.call('HVALS', KEYS[2])) do held = held + tonumber(n) end
local paused = paused_set(KEYS[4])
for q = 1, #ARGV - 2 do
  local queue_ready = redis.call('ZCARD', KEYS[3 + 2 * q])
  local queue_due, queue_first = 0, -1
  local entries = redis.call('ZRANGE', KEYS[4 + 2 * q], '-inf', horizon, 'BYSCORE', 'LIMIT', '0',
                             limit, 'WITHSCORES')
  for i = 1, #entries, 2 do
    if string.sub(entries[i], 1, 2) ~= LIMIT_PREFIX then
      queue_due = queue_due + 1
      local at = math.max(0, tonumber(entries[i + 1]) - now)
      if queue_first < 0 or at < queue_first then queue_first = at end
    end
  end
  local n = tonumber(redis.call('HGET', KEYS[3], PARKED_FIELD .. ARGV[2 + q]) or '0')
  if paused[ARGV[2 + q]] then
    waiting = waiting + queue_ready + queue_due + math.max(0, n)
  else
    ready, due, parked = ready + queue_ready, due + queue_due, parked + math.max(0, n)
    if queue_first >= 0 and (first < 0 or queue_first < first) then first = queue_first end
  end
end
return {ready, due, held, parked, first, waiting}
