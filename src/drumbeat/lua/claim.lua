-- Claims up to `limit` jobs for one worker: promotes what is due, pops the best of `ready`
-- by priority, and gives each a lease and a fresh fencing token.
--
-- KEYS[1] ready (zset)  KEYS[2] due (zset)    KEYS[3] jobs (hash)   KEYS[4] state (hash)
-- KEYS[5] owners (hash) KEYS[6] leases (zset) KEYS[7] fence (string) KEYS[8] seq (string)
-- KEYS[9] wake (zset)
-- ARGV[1] worker id   ARGV[2] limit   ARGV[3] lease_ms   ARGV[4] most due entries to promote
-- Returns {now_ms, next_due_ms or -1, then per job: id, spec or false, attempt, stalls,
--          token, priority}
local now = now_ms()
local worker, limit, lease_ms = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])

local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, tonumber(ARGV[4]))
if #due > 0 then
  local states = redis.call('HMGET', KEYS[4], unpack(due))
  local seq = redis.call('INCRBY', KEYS[8], #due) - #due
  for i, id in ipairs(due) do
    local s = parse_state(states[i])
    s.seq = seq + i
    redis.call('HSET', KEYS[4], id, format_state(s))
    redis.call('ZADD', KEYS[1], ready_score(s.priority, s.seq), id)
  end
  redis.call('ZREM', KEYS[2], unpack(due))
end

local out = {now, -1}
if limit > 0 then
  local popped = redis.call('ZPOPMIN', KEYS[1], limit)
  local n = #popped / 2
  if n > 0 then
    local ids = {}
    for i = 1, n do ids[i] = popped[i * 2 - 1] end
    local specs = redis.call('HMGET', KEYS[3], unpack(ids))
    local states = redis.call('HMGET', KEYS[4], unpack(ids))
    local token = redis.call('INCRBY', KEYS[7], n) - n
    local deadline = now + lease_ms
    for i, id in ipairs(ids) do
      token = token + 1
      local s = parse_state(states[i])
      s.attempt = s.attempt + 1
      redis.call('HSET', KEYS[4], id, format_state(s))
      redis.call('HSET', KEYS[5], id, string.format('%d|%s|%d', token, worker, now))
      redis.call('ZADD', KEYS[6], deadline, id)
      out[#out + 1] = id
      out[#out + 1] = specs[i]
      out[#out + 1] = s.attempt
      out[#out + 1] = s.stalls
      out[#out + 1] = token
      out[#out + 1] = s.priority
    end
  end
end

-- One marker woke this worker; pass it on so work left behind does not wait for a timeout.
if redis.call('ZCARD', KEYS[1]) > 0 then wake(KEYS[9]) end
local head = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
if head[2] then out[2] = tonumber(head[2]) end
return out
