-- Creates or updates schedules by id. An unchanged definition keeps its place and totals (so
-- re-registering every schedule at start-up shifts nothing); a changed one gets a new
-- generation and its new first due time, unless its run is in flight: then the run's
-- completion reschedules it by the new definition. Pause state and totals are kept. A schedule
-- routed to a queue other than the default one registers that queue in `queues`.
--
-- KEYS[1] due (zset)  KEYS[2] state (hash)  KEYS[3] wake (zset)  KEYS[4] tasks (hash)
-- KEYS[5] queues (set)
-- KEYS[4 + 2i] wheel:<b> (zset), KEYS[5 + 2i] schedules:<b> (hash) of the i-th schedule
-- ARGV    groups of 8, one per schedule: id, bucket, priority, first grid slot ms,
--         first due ms, task name, spec, queue (empty for the default one)
-- Returns one integer per schedule: 1 created, 2 updated, 0 unchanged
local out = {}
for i = 1, #ARGV / 8 do
  local a = (i - 1) * 8
  local id, bucket, priority = ARGV[a + 1], ARGV[a + 2], tonumber(ARGV[a + 3])
  local grid, due, spec = tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5]), ARGV[a + 7]
  local wheel_key, schedules_key = KEYS[4 + 2 * i], KEYS[5 + 2 * i]
  local queue = ARGV[a + 8]
  if queue ~= '' then redis.call('SADD', KEYS[5], queue) end
  local task = task_code(KEYS[4], ARGV[a + 6], queue)
  local old = parse_schedule(redis.call('HGET', schedules_key, id))
  if old and old.spec == spec and old.priority == priority and old.task == task then
    out[#out + 1] = 0
  else
    local s = old or {gen = 0, paused = false, runs = 0, failures = 0, misfires = 0,
                      last_start = 0, last_ms = 0, late = '0'}
    s.gen, s.grid, s.priority, s.task, s.spec = s.gen + 1, grid, priority, task, spec
    redis.call('HSET', schedules_key, id, format_schedule(s))
    if not s.paused and not run_in_flight(KEYS[2], RUN_PREFIX .. id) then
      wheel_add(KEYS[1], wheel_key, bucket, id, due)
      wake_if_head(KEYS[1], KEYS[3], WHEEL_PREFIX .. bucket)
    end
    out[#out + 1] = old and 2 or 1
  end
end
return out
