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
  -- Every slot is made at the first write, so the hash never grows afterwards.
  if redis.call('EXISTS', KEYS[2]) == 0 then
    local empty = {}
    for slot = 0, THROUGHPUT_WINDOWS - 1 do
      empty[#empty + 1] = slot
      empty[#empty + 1] = '-1|0|0'
    end
    redis.call('HSET', KEYS[2], unpack(empty))
  end
  local window = math.floor(now_ms() / THROUGHPUT_WINDOW_MS)
  local slot = window % THROUGHPUT_WINDOWS
  local held = redis.call('HGET', KEYS[2], slot) or '-1|0|0'
  local w, c, f = string.match(held, '^(-?%d+)|(-?%d+)|(-?%d+)$')
  if tonumber(w) ~= window then c, f = 0, 0 end
  redis.call('HSET', KEYS[2], slot, string.format('%d|%d|%d', window,
    (tonumber(c) or 0) + completed, (tonumber(f) or 0) + failed))
end
return #ARGV / 2
