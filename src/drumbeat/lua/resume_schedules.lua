-- Resumes paused schedules at their next slot from now (the paused stretch is not caught up).
--
-- KEYS[1] due (zset)  KEYS[2] state (hash)  KEYS[3] wake (zset)
-- KEYS[2 + 2i] wheel:<b> (zset), KEYS[3 + 2i] schedules:<b> (hash) of the i-th schedule
-- ARGV    groups of 4: id, bucket, next grid slot ms, next due ms
-- Returns the number of schedules resumed.
local n = 0
for i = 1, #ARGV / 4 do
  local a = (i - 1) * 4
  local id, bucket = ARGV[a + 1], ARGV[a + 2]
  local wheel_key, schedules_key = KEYS[2 + 2 * i], KEYS[3 + 2 * i]
  local s = parse_schedule(redis.call('HGET', schedules_key, id))
  if s and s.paused then
    s.paused, s.grid = false, tonumber(ARGV[a + 3])
    redis.call('HSET', schedules_key, id, format_schedule(s))
    if not run_in_flight(KEYS[2], RUN_PREFIX .. id) then
      wheel_add(KEYS[1], wheel_key, bucket, id, tonumber(ARGV[a + 4]))
      wake_if_head(KEYS[1], KEYS[3], WHEEL_PREFIX .. bucket)
    end
    n = n + 1
  end
end
return n
