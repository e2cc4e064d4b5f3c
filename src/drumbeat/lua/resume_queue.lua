-- Resumes a paused queue on one shard (`App.resume_queue` calls it on every shard): takes it out
-- of this shard's copy of `pauses` and, when the queue's keys are given, wakes its idle workers
-- at once (a marker on its `wake`, as an enqueue leaves) rather than after their idle block,
-- and tells busy ones (signals) when a job above the lowest priority waits, so a checkpoint
-- may lend it a slot.
--
-- KEYS[1] pauses (set)
-- KEYS[2] signals (channel), KEYS[3] ready (zset), KEYS[4] wake (zset) of the queue: optional
--         (a schedule shard has no keys of a queue other than the default one)
-- ARGV[1] queue name ("default" for the default queue)
-- Returns 1 resumed, 0 it was not paused
local removed = redis.call('SREM', KEYS[1], ARGV[1])
if removed == 1 and KEYS[4] then
  wake(KEYS[4])
  -- Signals of the default queue carry no name (see ready_signal).
  local queue = ARGV[1] == 'default' and '' or ARGV[1]
  signal_if_better(KEYS[3], KEYS[2], MIN_PRIORITY, queue)
end
return removed
