-- PROBE (bench/flat_probe.py), not used by drumbeat: the end of a finish_runs.lua for a flat
-- schedule, one zset of schedules by next run and one hash of their records per shard instead
-- of the wheel's buckets. flat_probe.py puts finish_runs.lua's own start before it (its
-- fencing and bookkeeping, the runs grouped by bucket in `buckets`), so the work per run is
-- the same; then one call per key for the whole batch.
--
-- KEYS[8] records (hash) KEYS[9] schedules by next run (zset); ARGV as finish_runs.lua's, with
-- every run's bucket slot 1 (so its group names KEYS[8] and KEYS[9], which this part reads)
local faults, all, ids = {}, {}, {}
for _, group in pairs(buckets) do
  for _, run in ipairs(group.runs) do
    all[#all + 1] = run
    ids[#ids + 1] = run_schedule_id(run.member)
  end
end
if #all > 0 then
  local records = redis.call('HMGET', KEYS[8], unpack(ids))
  local writes, waits = {}, {}
  for j, run in ipairs(all) do
    local record, next_due, next_raw = after_run(records[j], run)
    if record then
      if run.outcome == 'fail' then faults[#faults + 1], faults[#faults + 2] = ids[j], run.err end
      writes[#writes + 1], writes[#writes + 2] = ids[j], record
      if next_due then waits[#waits + 1], waits[#waits + 2] = next_raw, ids[j] end
    end
  end
  call_many('HSET', KEYS[8], writes)
  call_many('ZADD', KEYS[9], waits)
end
call_many('HSET', KEYS[5], faults)
return out
