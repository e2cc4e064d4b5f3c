-- Adds a worker's counts of settled jobs to the metrics counters (sent with each settle batch,
-- so counting costs no round trip of its own; see worker/tally.py), and the attempts that
-- completed or raised to the current window of the throughput series (the overview's chart).
--
-- KEYS[1] metrics (hash)  KEYS[2] throughput (hash)
-- ARGV    pairs: field, increment (negative to take back a count whose settle was refused)
-- Returns the number of fields changed
local completed, failed = 0, 0
for i = 1, #ARGV, 2 do
  redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1])
  local outcome = string.match(ARGV[i], '^j|(%a+)|')
  if outcome == 'complete' then
    completed = completed + tonumber(ARGV[i + 1])
  elseif outcome == 'failed' or outcome == 'retried' or outcome == 'dead' then
    failed = failed + tonumber(ARGV[i + 1])
  end
end
if completed ~= 0 or failed ~= 0 then
  local window = math.floor(now_ms() / THROUGHPUT_WINDOW_MS)
  local slot = window % THROUGHPUT_WINDOWS
  if tonumber(redis.call('HGET', KEYS[2], 'w' .. slot)) ~= window then
    redis.call('HSET', KEYS[2], 'w' .. slot, window, 'c' .. slot, 0, 'f' .. slot, 0)
  end
  if completed ~= 0 then redis.call('HINCRBY', KEYS[2], 'c' .. slot, completed) end
  if failed ~= 0 then redis.call('HINCRBY', KEYS[2], 'f' .. slot, failed) end
end
return #ARGV / 2
