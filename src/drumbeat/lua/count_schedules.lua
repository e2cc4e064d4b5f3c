-- Counts schedules: the sum of HLEN over the given wheel buckets (`Scheduler.count`). One call
-- per few thousand buckets, because 16,384 pipelined HLENs cost the client ~100 ms to encode and
-- parse where Redis answers them in a few.
--
-- KEYS[i] schedules:<bucket> (hash)
-- Returns the number of schedules in those buckets.
local n = 0
for i = 1, #KEYS do
  n = n + redis.call('HLEN', KEYS[i])
end
return n
