-- Deletes dead-lettered jobs for good (`drumbeat dead purge`).
--
-- KEYS[1] dead (zset)  KEYS[2] errors (hash)  KEYS[3] state (hash)  KEYS[4] jobs (hash)
-- KEYS[5] progress (hash)
-- ARGV    job ids
-- Returns the number of jobs deleted.
local n = 0
for _, id in ipairs(ARGV) do
  if redis.call('ZREM', KEYS[1], id) == 1 then
    redis.call('HDEL', KEYS[2], id)
    redis.call('HDEL', KEYS[3], id)
    redis.call('HDEL', KEYS[4], id)
    redis.call('HDEL', KEYS[5], id)
    n = n + 1
  end
end
return n
