-- Adds a worker's counts of settled jobs to the metrics counters (sent with each settle batch,
-- so counting costs no round trip of its own; see worker/tally.py).
--
-- KEYS[1] metrics (hash)
-- ARGV    pairs: field, increment (negative to take back a count whose settle was refused)
-- Returns the number of fields changed
for i = 1, #ARGV, 2 do
  redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1])
end
return #ARGV / 2
