-- Reads where one job is, atomically (a job moving between sets is never seen in none).
--
-- KEYS[1] ready (zset)  KEYS[2] due (zset)  KEYS[3] leases (zset)  KEYS[4] dead (zset)
-- KEYS[5] results (hash) KEYS[6] state (hash)
-- ARGV[1] job id
-- Returns {status, outcome or false, state or false}; status is one of queued, scheduled,
--         running, dead, finished, missing
local id = ARGV[1]
local outcome = redis.call('HGET', KEYS[5], id)
local state = redis.call('HGET', KEYS[6], id)
local status = 'missing'
if redis.call('ZSCORE', KEYS[3], id) then status = 'running'
elseif redis.call('ZSCORE', KEYS[1], id) then status = 'queued'
elseif redis.call('ZSCORE', KEYS[2], id) then status = 'scheduled'
elseif redis.call('ZSCORE', KEYS[4], id) then status = 'dead'
elseif outcome then status = 'finished'
end
return {status, outcome, state}
