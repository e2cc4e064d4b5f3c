-- Pauses a queue on one shard (`App.pause_queue` calls it on every shard, each of which keeps
-- a copy of `pauses` that its claims read): claim.lua and claim_urgent.lua take nothing from
-- a paused queue; its jobs wait in `ready` and `due`, and runs already claimed go on.
--
-- KEYS[1] pauses (set: the paused queues' names)
-- ARGV[1] queue name ("default" for the default queue)
-- Returns 1 paused, 0 it was paused already
return redis.call('SADD', KEYS[1], ARGV[1])
