-- Settles finished runs of schedules and puts each schedule back in `due` for its next run, in
-- the same atomic step, so a run is never lost from its schedule nor doubled. Fenced like
-- complete.lua. If the definition changed while the run was in flight (another generation),
-- the next run follows the new definition's first slot; if it was paused or removed, nothing
-- is rescheduled.
--
-- KEYS[1] schedules (hash)  KEYS[2] due (zset)    KEYS[3] leases (zset)  KEYS[4] owners (hash)
-- KEYS[5] state (hash)      KEYS[6] faults (hash)  KEYS[7] wake (zset)
-- ARGV    groups of 8, one per run: member ("s:<id>"), token, outcome (ok | fail | skip),
--         duration ms, generation it ran, next grid slot ms, next due ms, error text
-- Returns one integer per run: 1 settled, 0 refused (lease lost)
local out = {}
for i = 0, #ARGV / 8 - 1 do
  local member, token, outcome = ARGV[i * 8 + 1], ARGV[i * 8 + 2], ARGV[i * 8 + 3]
  if owns(KEYS[4], member, token) then
    local owner = redis.call('HGET', KEYS[4], member)
    redis.call('HDEL', KEYS[4], member)
    redis.call('ZREM', KEYS[3], member)
    redis.call('HDEL', KEYS[5], member)
    local id = run_schedule_id(member)
    local s = id and parse_schedule(redis.call('HGET', KEYS[1], id))
    if s then
      if outcome == 'skip' then
        s.misfires = s.misfires + 1
      else
        s.runs = s.runs + 1
        s.last_start = tonumber(string.match(owner, '|(%d+)$')) or 0
        s.last_ms = tonumber(ARGV[i * 8 + 4])
        if outcome == 'fail' then
          s.failures = s.failures + 1
          redis.call('HSET', KEYS[6], id, ARGV[i * 8 + 8])
        end
      end
      local due = s.grid
      if s.gen == tonumber(ARGV[i * 8 + 5]) then
        s.grid, due = tonumber(ARGV[i * 8 + 6]), tonumber(ARGV[i * 8 + 7])
      end
      redis.call('HSET', KEYS[1], id, format_schedule(s))
      if not s.paused then
        redis.call('ZADD', KEYS[2], due, member)
        wake_if_head(KEYS[2], KEYS[7], member)
      end
    end
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
