-- Deletes dead-lettered jobs for good (`drumbeat dead purge`).
--
-- KEYS[1] dead (zset)  KEYS[2] errors (hash)  KEYS[3] state (hash)  KEYS[4] jobs (hash)
-- KEYS[5] progress (hash)  KEYS[6] orphans (hash: _workflows.lua, what it holds of them goes)
-- ARGV    job ids
-- Returns the number of jobs deleted.
local n, gone = 0, {}
for _, id in ipairs(ARGV) do
  if redis.call('ZREM', KEYS[1], id) == 1 then
    redis.call('HDEL', KEYS[2], id)
    redis.call('HDEL', KEYS[3], id)
    redis.call('HDEL', KEYS[4], id)
    redis.call('HDEL', KEYS[5], id)
    n = n + 1
    gone[n] = id
  end
end
forget_orphans({orphans = KEYS[6]}, gone)
return n
