-- Moves the due runs of some schedule buckets into `ready` (a claim reported the buckets; it
-- cannot open them itself, since their keys were not known before it ran). Each run gets its
-- state (due time, grid slot, generation) and a copy of its task name and arguments in `jobs`,
-- so from here on it is claimed, leased, fenced and reaped like a job. A schedule is out of its
-- bucket while its run is queued or in flight, so it cannot run twice at once. Each bucket's
-- marker in `due` is re-scored at its new earliest due time.
--
-- KEYS[1] due (zset)   KEYS[2] ready (zset)  KEYS[3] jobs (hash)  KEYS[4] state (hash)
-- KEYS[5] seq (string) KEYS[6] wake (zset)   KEYS[7] tasks (hash)
-- KEYS[6 + 2i] wheel:<b> (zset), KEYS[7 + 2i] schedules:<b> (hash) of the i-th bucket
-- ARGV    bucket numbers
-- Returns the number of runs promoted.
local now = now_ms()
local promoted = 0
local names = {}

local function task_name(code)
  if names[code] == nil then names[code] = redis.call('HGET', KEYS[7], '#' .. code) or '?' end
  return names[code]
end

for i, bucket in ipairs(ARGV) do
  local wheel_key, schedules_key = KEYS[6 + 2 * i], KEYS[7 + 2 * i]
  local due = redis.call('ZRANGEBYSCORE', wheel_key, '-inf', now, 'WITHSCORES')
  if #due > 0 then
    local ids = {}
    for j = 1, #due, 2 do ids[#ids + 1] = due[j] end
    local records = redis.call('HMGET', schedules_key, unpack(ids))
    local seq = redis.call('INCRBY', KEYS[5], #ids) - #ids
    for j, id in ipairs(ids) do
      local s = parse_schedule(records[j])
      if s and not s.paused then
        local member = RUN_PREFIX .. id
        redis.call('HSET', KEYS[4], member, format_state({attempt = 0, stalls = 0,
          priority = s.priority, seq = seq + j, key = string.format('%d:%d:%d:0',
          tonumber(due[j * 2]), s.grid, s.gen)}))
        redis.call('HSET', KEYS[3], member, task_name(s.task) .. '|' .. s.spec)
        redis.call('ZADD', KEYS[2], ready_score(s.priority, seq + j), member)
        promoted = promoted + 1
      end
    end
    redis.call('ZREM', wheel_key, unpack(ids))
  end
  wheel_settle(KEYS[1], wheel_key, bucket)
end
if promoted > 0 then wake(KEYS[6]) end
return promoted
