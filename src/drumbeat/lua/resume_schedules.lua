-- Resumes paused schedules at their next slot from now (the paused stretch is not caught up).
--
-- KEYS[1] schedules (hash)  KEYS[2] due (zset)  KEYS[3] ready (zset)  KEYS[4] leases (zset)
-- KEYS[5] wake (zset)
-- ARGV    groups of 3: id, next grid slot ms, next due ms
-- Returns the number of schedules resumed.
local n = 0
for i = 0, #ARGV / 3 - 1 do
  local id = ARGV[i * 3 + 1]
  local s = parse_schedule(redis.call('HGET', KEYS[1], id))
  if s and s.paused then
    local member = RUN_PREFIX .. id
    s.paused, s.grid = false, tonumber(ARGV[i * 3 + 2])
    redis.call('HSET', KEYS[1], id, format_schedule(s))
    if not run_in_flight(KEYS[3], KEYS[4], member) then
      redis.call('ZADD', KEYS[2], tonumber(ARGV[i * 3 + 3]), member)
      wake_if_head(KEYS[2], KEYS[5], member)
    end
    n = n + 1
  end
end
return n
