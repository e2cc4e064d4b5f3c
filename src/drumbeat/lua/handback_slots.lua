-- Gives back runs a worker claimed from time slots and will not run (a graceful stop past
-- shutdown_grace, or runs whose settle Redis refused for good): each run still in flight (`where` names the slot it was
-- claimed from) goes back, as it was claimed, into a due slot (a run back from a lapsed lease
-- at the slot's end, counted in `stalled`), leaves its lot (so a reaper cannot put it back
-- twice) and the incarnation's count in `busy`, and the lateness its claim counted is taken
-- back (its next claim counts it again).
--
-- KEYS[1] where (hash)  KEYS[2] slots (zset)  KEYS[3] lateness (hash)  KEYS[4] stalled (hash)
-- KEYS[5] slot:<ms> the runs go back into  KEYS[6] inflight:<incarnation> (hash)
-- KEYS[7] busy (hash)  KEYS[7 + i] claimed:<incarnation>:<lot> of the i-th lot holding them
-- ARGV[1] that slot's ms (at or before now)  ARGV[2] c (lots)  ARGV[2 + i] the i-th lot
-- ("<claim number>:<slot ms>")  ARGV[3 + c] the incarnation  ARGV[4 + c ...] schedule ids
-- Returns the number of runs given back (a run no longer in flight with the worker is not)
local ms, c = ARGV[1], tonumber(ARGV[2])
local want = {}
for i = 4 + c, #ARGV do want[ARGV[i]] = true end
local fresh, stalled, where = {}, {}, {}
for i = 1, c do
  local lot, lot_key = ARGV[2 + i], KEYS[7 + i]
  local due = string.match(lot, ':(%d+)$')
  local claimed = redis.call('HGET', KEYS[6], lot)
  local found = {}
  for _, entry in ipairs(claimed and redis.call('LRANGE', lot_key, '0', '-1') or {}) do
    local id, mark = string.match(entry, '^([^|;]+)([|;])')
    if id and want[id] and redis.call('HGET', KEYS[1], id) == due then
      want[id] = nil
      found[#found + 1] = entry
      where[#where + 1], where[#where + 2] = id, ms
      if mark == '|' then
        fresh[#fresh + 1] = entry
        -- A run back from a lapsed lease was not counted by this claim (claim_slots.lua).
        unrecord_lateness(KEYS[3], claimed + 0, math.max(0, claimed - due))
      else
        stalled[#stalled + 1] = entry
      end
    end
  end
  for _, entry in ipairs(found) do redis.call('LREM', lot_key, '1', entry) end
end
if #where == 0 then return 0 end
call_many('RPUSH', KEYS[5], fresh)
call_many('RPUSH', KEYS[5], stalled)
if #stalled > 0 then redis.call('HINCRBY', KEYS[4], ms, string.format('%d', #stalled)) end
redis.call('ZADD', KEYS[2], ms, ms)
call_many('HSET', KEYS[1], where)
local back = #where / 2
if redis.call('HINCRBY', KEYS[7], ARGV[3 + c], string.format('%d', -back)) <= 0 then
  redis.call('HDEL', KEYS[7], ARGV[3 + c])
end
return back
