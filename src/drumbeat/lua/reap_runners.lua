-- Takes back the runs of worker process incarnations whose lease in `runners` lapsed (time
-- slots; opt-in: Settings.schedule_store "slots"): each run's entry goes back into a due slot
-- marked with one more stall, its due time and its first start (so its lateness still counts
-- to its first start, and after max_stalls its next claim counts it failed without running
-- it, as reap.lua does for the wheel's runs); the incarnation's in-flight hash and its entry
-- in `runners` go, so its late settles are refused and its next claim is told it was reaped.
-- The caller read the lapsed incarnations from `runners` first; one renewed since is left.
--
-- KEYS[1] runners (zset)  KEYS[2] where (hash)  KEYS[3] slots (zset)
-- KEYS[4] slot:<ms> the runs go back into  KEYS[4 + i] inflight:<incarnation> of the i-th
-- ARGV[1] that slot's ms (at or before now: due)  ARGV[1 + i] the i-th incarnation
-- Returns the number of runs taken back
local now = now_ms()
local ms = ARGV[1]
local back, where = {}, {}
for i = 2, #ARGV do
  local incarnation, key = ARGV[i], KEYS[3 + i]
  local lease = redis.call('ZSCORE', KEYS[1], incarnation)
  if lease and lease + 0 <= now then
    local flat = redis.call('HGETALL', key)
    for j = 1, #flat, 2 do
      local id = flat[j]
      local due, first, entry = string.match(flat[j + 1], '^(%d+)|(%d+)|(.*)$')
      if entry then
        local stalls, was, since, record =
          string.match(entry, '^[^|;]+;(%d+);(%d+);(%d+)|(.*)$')
        if stalls then
          stalls, due, first = stalls + 1, was, since
        else
          stalls, record = 1, entry_record(entry)
        end
        back[#back + 1] = id .. ';' .. stalls .. ';' .. due .. ';' .. first .. '|' .. record
        where[#where + 1], where[#where + 2] = id, ms
      end
    end
    redis.call('DEL', key)
    redis.call('ZREM', KEYS[1], incarnation)
  end
end
if #back > 0 then
  call_many('RPUSH', KEYS[4], back)
  redis.call('ZADD', KEYS[3], ms, ms)
  call_many('HSET', KEYS[2], where)
end
return #back
