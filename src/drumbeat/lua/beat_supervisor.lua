-- Registers a supervisor (what it runs, for the others' shares and for `drumbeat status`) until
-- `ttl` from now, and sweeps the supervisors whose registration expired (it stopped beating);
-- an empty info deregisters it (a supervisor that stops). The score is the expiry, so readers
-- need not know the ttl a supervisor chose.
--
-- KEYS[1] supervisors (zset)  KEYS[2] supervisorinfo (hash)
-- ARGV[1] supervisor id  ARGV[2] info (JSON, opaque here; empty: deregister)  ARGV[3] ttl ms
-- Returns the Redis time in ms
local now = now_ms()
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. now)
if #gone > 0 then
  call_many('ZREM', KEYS[1], gone)
  call_many('HDEL', KEYS[2], gone)
end
if ARGV[2] == '' then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], ARGV[1])
else
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
end
return now
