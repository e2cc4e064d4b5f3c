-- Returns claimed jobs of one queue to the front of their priority level at once (graceful
-- shutdown, or a run stopped at a checkpoint), without spending an attempt. Fenced like
-- complete.lua.
--
-- KEYS[1] leases (zset)  KEYS[2] owners (hash)  KEYS[3] state (hash)  KEYS[4] ready (zset)
-- KEYS[5] wake (zset)    KEYS[6] signals (pub/sub channel)   (ready and wake: the jobs' queue)
-- KEYS[7] lateness (hash: a schedule run's first claim counted its lateness; given back here)
-- ARGV[1] the queue's name, empty for the default queue
-- ARGV    then id, token pairs
-- Returns one integer per job: 1 handed back, 0 refused (lease lost).
local out, n = {}, 0
local before = ready_priority(KEYS[4])
for i = 2, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  if owns(KEYS[2], id, token) then
    local s = parse_state(redis.call('HGET', KEYS[3], id))
    give_back_lateness(KEYS[7], KEYS[2], id, s)
    if s.attempt > 0 then s.attempt = s.attempt - 1 end
    redis.call('HSET', KEYS[3], id, format_state(s))
    redis.call('HDEL', KEYS[2], id)
    redis.call('ZREM', KEYS[1], id)
    redis.call('ZADD', KEYS[4], ready_score(s.priority, s.seq), id)
    n = n + 1
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
if n > 0 then
  wake(KEYS[5])
  signal_if_better(KEYS[4], KEYS[6], before, ARGV[1])
end
return out
