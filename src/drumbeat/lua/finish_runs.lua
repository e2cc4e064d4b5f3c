-- Settles finished runs of schedules and puts each schedule back in its bucket for its next
-- run, in the same atomic step, so a run is never lost from its schedule nor doubled. Fenced
-- like complete.lua. If the definition changed while the run was in flight (another
-- generation), the next run follows the new definition's first slot; if it was paused or
-- removed, nothing is rescheduled.
--
-- KEYS[1] due (zset)    KEYS[2] leases (zset)  KEYS[3] owners (hash)  KEYS[4] state (hash)
-- KEYS[5] faults (hash) KEYS[6] wake (zset)    KEYS[7] jobs (hash)
-- KEYS[6 + 2i] wheel:<b> (zset), KEYS[7 + 2i] schedules:<b> (hash) of the i-th run's schedule
-- ARGV    one per run, packed (one argument is far cheaper to send than nine):
--         "<member>|<token>|<outcome ok|fail|skip>|<duration ms>|<generation run>|
--          <next grid ms>|<next due ms>|<bucket>|<error text, may hold anything>"
-- Returns one integer per run: 1 settled, 0 refused (lease lost)
local out = {}
local earliest
local marks = {}
for i, packed in ipairs(ARGV) do
  local member, token, outcome, ms, gen, grid, due, bucket, err = string.match(packed,
    '^([^|]+)|(%d+)|(%a+)|(%d+)|(%-?%d+)|(%-?%d+)|(%-?%d+)|(%d+)|(.*)$')
  local owner = member and redis.call('HGET', KEYS[3], member)
  if owner and string.match(owner, '^(%d+)|') == token then
    local wheel_key, schedules_key = KEYS[6 + 2 * i], KEYS[7 + 2 * i]
    redis.call('HDEL', KEYS[3], member)
    redis.call('ZREM', KEYS[2], member)
    redis.call('HDEL', KEYS[4], member)
    redis.call('HDEL', KEYS[7], member)
    local id = run_schedule_id(member)
    local s = id and parse_schedule(redis.call('HGET', schedules_key, id))
    if s then
      if outcome == 'skip' then
        s.misfires = s.misfires + 1
      else
        s.runs = s.runs + 1
        s.last_start = tonumber(string.match(owner, '|(%d+)$')) or 0
        s.last_ms = tonumber(ms)
        if outcome == 'fail' then
          s.failures = s.failures + 1
          redis.call('HSET', KEYS[5], id, err)
        end
      end
      local next_due = s.grid
      if s.gen == tonumber(gen) then s.grid, next_due = tonumber(grid), tonumber(due) end
      redis.call('HSET', schedules_key, id, format_schedule(s))
      if not s.paused then
        redis.call('ZADD', wheel_key, next_due, id)
        if not marks[bucket] or next_due < marks[bucket] then marks[bucket] = next_due end
        if not earliest or next_due < earliest then earliest = next_due end
      end
    end
    out[i] = 1
  else
    out[i] = 0
  end
end
-- One marker update per bucket (runs of one bucket fall due, and end, together).
for bucket, due in pairs(marks) do
  redis.call('ZADD', KEYS[1], 'LT', due, WHEEL_PREFIX .. bucket)
end
-- One check per batch: wake a worker if a bucket now heads `due` at one of these runs' times
-- (idle workers sleep until the earliest due time they saw).
if earliest then
  local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  if head[2] and tonumber(head[2]) >= earliest then wake(KEYS[6]) end
end
return out
