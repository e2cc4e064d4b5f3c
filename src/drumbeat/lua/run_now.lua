-- Queues one extra run of each schedule now, unless one is already queued or in flight (a
-- schedule never runs concurrently with itself). Its cadence is kept: after this run, the
-- schedule resumes at the slot it was waiting for.
--
-- KEYS[1] ready (zset)  KEYS[2] leases (zset)  KEYS[3] state (hash)  KEYS[4] seq (string)
-- KEYS[5] wake (zset)   KEYS[6] jobs (hash)    KEYS[7] tasks (hash)
-- KEYS[6 + 2i] wheel:<b> (zset), KEYS[7 + 2i] schedules:<b> (hash) of the i-th schedule
-- ARGV    schedule ids
-- Returns the number of runs queued.
local now = now_ms()
local n = 0
for i, id in ipairs(ARGV) do
  local s = parse_schedule(redis.call('HGET', KEYS[7 + 2 * i], id))
  local member = RUN_PREFIX .. id
  if s and not run_in_flight(KEYS[3], member) then
    redis.call('ZREM', KEYS[6 + 2 * i], id)
    local seq = redis.call('INCR', KEYS[4])
    redis.call('HSET', KEYS[3], member, format_state({attempt = 0, stalls = 0,
      priority = s.priority, seq = seq, key = string.format('%d:%d:%d:1', now, s.grid, s.gen)}))
    local name = redis.call('HGET', KEYS[7], '#' .. s.task) or '?'
    redis.call('HSET', KEYS[6], member, name .. '|' .. s.spec)
    redis.call('ZADD', KEYS[1], ready_score(s.priority, seq), member)
    n = n + 1
  end
end
if n > 0 then wake(KEYS[5]) end
return n
