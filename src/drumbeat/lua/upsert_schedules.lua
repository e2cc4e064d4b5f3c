-- Creates or updates schedules by id. An unchanged definition keeps its place and totals (so
-- re-registering every schedule at start-up shifts nothing); a changed one gets a new
-- generation and its new first due time, unless its run is in flight: then the run's
-- completion reschedules it by the new definition. Pause state and totals are kept.
--
-- KEYS[1] schedules (hash)  KEYS[2] due (zset)  KEYS[3] ready (zset)  KEYS[4] leases (zset)
-- KEYS[5] wake (zset)
-- ARGV    groups of 5, one per schedule: id, priority, first grid slot ms, first due ms, spec
-- Returns one integer per schedule: 1 created, 2 updated, 0 unchanged
local out = {}
for i = 0, #ARGV / 5 - 1 do
  local id, priority = ARGV[i * 5 + 1], tonumber(ARGV[i * 5 + 2])
  local grid, due, spec = tonumber(ARGV[i * 5 + 3]), tonumber(ARGV[i * 5 + 4]), ARGV[i * 5 + 5]
  local member = RUN_PREFIX .. id
  local old = parse_schedule(redis.call('HGET', KEYS[1], id))
  if old and old.spec == spec and old.priority == priority then
    out[#out + 1] = 0
  else
    local s = old or {gen = 0, paused = false, runs = 0, failures = 0, misfires = 0,
                      last_start = 0, last_ms = 0}
    s.gen, s.grid, s.priority, s.spec = s.gen + 1, grid, priority, spec
    redis.call('HSET', KEYS[1], id, format_schedule(s))
    if not s.paused and not run_in_flight(KEYS[3], KEYS[4], member) then
      redis.call('ZADD', KEYS[2], due, member)
      wake_if_head(KEYS[2], KEYS[5], member)
    end
    out[#out + 1] = old and 2 or 1
  end
end
return out
