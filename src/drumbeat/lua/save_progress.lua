-- Saves a running job's progress at a checkpoint, fenced by its claim's token: a run whose
-- lease was taken over cannot overwrite the progress of the run that took it over.
--
-- KEYS[1] owners (hash)  KEYS[2] progress (hash)
-- ARGV[1] job id  ARGV[2] fencing token  ARGV[3] progress (encoded by the payload codec)
-- Returns 1 saved, 0 refused (this claim no longer owns the job)
if not owns(KEYS[1], ARGV[1], ARGV[2]) then return 0 end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
return 1
