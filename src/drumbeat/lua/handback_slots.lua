-- Gives back runs a worker claimed from time slots and will not run (a graceful stop past
-- shutdown_grace, or runs whose settle Redis refused for good; opt-in:
-- Settings.schedule_store "slots"): each run still in flight (`where` names the slot it was
-- claimed from) goes back, as it was claimed, into a due slot, leaves its claim's list (so a
-- reaper cannot put it back twice), and the lateness its claim counted is taken back (its next
-- claim counts it again).
--
-- KEYS[1] where (hash)  KEYS[2] slots (zset)  KEYS[3] lateness (hash)
-- KEYS[4] slot:<ms> the runs go back into  KEYS[5 ...] claimed:<incarnation>:<n> of the claims
-- that took them
-- ARGV[1] that slot's ms (at or before now)  ARGV[2 ...] schedule ids
-- Returns the number of runs given back (a run no longer in flight with the worker is not)
local ms = ARGV[1]
local want = {}
for i = 2, #ARGV do want[ARGV[i]] = true end
local back, where = {}, {}
for k = 5, #KEYS do
  local due, claimed, found = nil, nil, {}
  for _, item in ipairs(redis.call('LRANGE', KEYS[k], '0', '-1')) do
    local d, c = string.match(item, '^#(%d+)|(%d+)$')
    if d then
      due, claimed = d, c
    else
      local id = string.match(item, '^([^|;]+)[|;]')
      if id and due and want[id] and redis.call('HGET', KEYS[1], id) == due then
        want[id] = nil
        back[#back + 1], found[#found + 1] = item, item
        where[#where + 1], where[#where + 2] = id, ms
        -- A run back from a lapsed lease was not counted by this claim (claim_slots.lua).
        if string.sub(item, #id + 1, #id + 1) == '|' then
          unrecord_lateness(KEYS[3], claimed + 0, math.max(0, claimed - due))
        end
      end
    end
  end
  for _, item in ipairs(found) do redis.call('LREM', KEYS[k], '1', item) end
end
if #back == 0 then return 0 end
call_many('RPUSH', KEYS[4], back)
redis.call('ZADD', KEYS[2], ms, ms)
call_many('HSET', KEYS[1], where)
return #back
