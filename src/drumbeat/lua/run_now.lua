-- Queues one extra run of each schedule now, unless one is already queued or in flight (a
-- schedule never runs concurrently with itself). Its cadence is kept: after this run, the
-- schedule resumes at the slot it was waiting for.
--
-- KEYS[1] schedules (hash)  KEYS[2] due (zset)  KEYS[3] ready (zset)  KEYS[4] leases (zset)
-- KEYS[5] state (hash)      KEYS[6] seq (string) KEYS[7] wake (zset)
-- ARGV    schedule ids
-- Returns the number of runs queued.
local now = now_ms()
local n = 0
for _, id in ipairs(ARGV) do
  local s = parse_schedule(redis.call('HGET', KEYS[1], id))
  local member = RUN_PREFIX .. id
  if s and not run_in_flight(KEYS[3], KEYS[4], member) then
    redis.call('ZREM', KEYS[2], member)
    local seq = redis.call('INCR', KEYS[6])
    redis.call('HSET', KEYS[5], member, format_state({attempt = 0, stalls = 0,
      priority = s.priority, seq = seq, key = string.format('%d:%d:%d:1', now, s.grid, s.gen)}))
    redis.call('ZADD', KEYS[3], ready_score(s.priority, seq), member)
    n = n + 1
  end
end
if n > 0 then wake(KEYS[7]) end
return n
