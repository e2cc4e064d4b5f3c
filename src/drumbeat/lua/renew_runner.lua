-- Renews the lease of a worker process incarnation on its time-slot runs (see
-- claim_slots.lua), unless the reaper took them back.
--
-- KEYS[1] runners (zset)
-- ARGV[1] incarnation  ARGV[2] lease ms
-- Returns 1 renewed, 0 reaped (or never registered)
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], 'XX', string.format('%d', now_ms() + tonumber(ARGV[2])), ARGV[1])
return 1
