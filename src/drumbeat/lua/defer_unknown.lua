-- Hands back claimed jobs whose task the claiming worker does not know (a rolling deploy: a
-- worker of the new version will know it), without spending an attempt: each goes to its
-- queue's `due`, so no worker claims it again for a while, and the first time it is handed back
-- so is recorded in its state (the worker dead-letters it once that is `unknown_task_grace`
-- ago). The wait grows with the time nobody knew the task: the time since then, at least
-- ARGV[2] and at most ARGV[3] ms, so a worker that lacks the task claims it a few dozen times
-- over the grace, not in a loop. Fenced like complete.lua.
--
-- KEYS[1] leases (zset)  KEYS[2] owners (hash)  KEYS[3] state (hash)  KEYS[4] due (zset)
-- KEYS[5] wake (zset)   (due and wake: the jobs' queue)
-- ARGV[1] the queue's name, empty for the default queue  ARGV[2] least wait ms
-- ARGV[3] most wait ms   ARGV then id, token pairs
-- Returns one integer per job: 1 handed back, 0 refused (lease lost).
local now = now_ms()
local least, most = tonumber(ARGV[2]), tonumber(ARGV[3])
local out = {}
for i = 4, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  if owns(KEYS[2], id, token) then
    local s = parse_state(redis.call('HGET', KEYS[3], id))
    if s.attempt > 0 then s.attempt = s.attempt - 1 end
    if s.unknown == 0 then s.unknown = now end
    redis.call('HSET', KEYS[3], id, format_state(s))
    redis.call('HDEL', KEYS[2], id)
    redis.call('ZREM', KEYS[1], id)
    local wait = math.min(most, math.max(least, now - s.unknown))
    redis.call('ZADD', KEYS[4], now + wait, id)
    wake_if_head(KEYS[4], KEYS[5], id)
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
