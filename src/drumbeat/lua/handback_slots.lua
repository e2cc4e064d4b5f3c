-- Gives back runs a worker claimed from time slots and will not run (a graceful stop past
-- shutdown_grace; opt-in: Settings.schedule_store "slots"): each entry goes back, as it was
-- claimed, into a due slot, and the lateness its claim counted is taken back (its next claim
-- counts it again).
--
-- KEYS[1] inflight:<incarnation> (hash)  KEYS[2] where (hash)  KEYS[3] slots (zset)
-- KEYS[4] lateness (hash)  KEYS[5] slot:<ms> the runs go back into
-- ARGV[1] that slot's ms (at or before now)  ARGV[2 ...] schedule ids
-- Returns the number of runs given back (a run not in flight with this incarnation is not)
local ms = ARGV[1]
local ids = {unpack(ARGV, 2)}
if #ids == 0 then return 0 end
local held = redis.call('HMGET', KEYS[1], unpack(ids))
local back, where, gone = {}, {}, {}
for i, v in ipairs(ids) do
  local due, claimed, entry = nil, nil, nil
  if held[i] then due, claimed, entry = string.match(held[i], '^(%d+)|(%d+)|(.*)$') end
  if entry then
    back[#back + 1] = entry
    where[#where + 1], where[#where + 2] = v, ms
    gone[#gone + 1] = v
    -- A run back from a lapsed lease was not counted by this claim (claim_slots.lua).
    if string.sub(entry, #v + 1, #v + 1) == '|' then
      unrecord_lateness(KEYS[4], claimed + 0, math.max(0, claimed - due))
    end
  end
end
if #back == 0 then return 0 end
redis.call('HDEL', KEYS[1], unpack(gone))
redis.call('RPUSH', KEYS[5], unpack(back))
redis.call('ZADD', KEYS[3], ms, ms)
redis.call('HSET', KEYS[2], unpack(where))
return #back
