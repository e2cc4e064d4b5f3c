-- Settles runs claimed by claim_slots.lua (time slots, the default store).
-- The worker built each schedule's next entry (its record after the run: what after_run in
-- finish_runs.lua writes, `slots.settled_record`) and grouped them by the slot of their next
-- run. A run is still its claimer's while `where` names the slot it was claimed from: it is
-- settled, its entry pushed into its next slot, that slot noted in `where`, its error (a failed
-- run) in `faults`. Otherwise it is refused: the reaper or a hand-back put it back (another
-- run of the schedule may have started), or this settle was applied already (sent again after
-- a lost reply). A schedule changed while its run was in flight (`pending`) gets the new
-- definition, with a new generation, at the new definition's first due time, if it differs
-- from the run's: that slot's key was not passed, so the run stays in flight and its reply is
-- the entry to send again into that slot (settled then, as the definition is now applied); a
-- schedule removed meanwhile is dropped; one paused meanwhile (a 'P' in `pending`) has its
-- next entry, with any change, kept in `paused` instead of a slot. The lots the worker found all settled go: their
-- lists and their fields in the incarnation's `inflight` hash. The runs settled leave the
-- incarnation's count in `busy`.
--
-- KEYS[1] where (hash)  KEYS[2] slots (zset)  KEYS[3] pending (hash)  KEYS[4] faults (hash)
-- KEYS[5] inflight:<incarnation> (hash)  KEYS[6] busy (hash)  KEYS[7] paused (hash)
-- KEYS[7 + k] claimed:<incarnation>:<lot> of the k-th lot to drop (d of them)
-- KEYS[7 + d + j] slot:<ms> of the j-th group's next slot (g groups: runs claimed from one
-- slot and due next in one slot)
-- ARGV[1] incarnation  ARGV[2] n (runs)  ARGV[3] d  ARGV[4 .. d + 3] the lots ("<n>:<ms>");
-- then per group j: the ms of the slot its runs were claimed from, the ms of their next slot,
-- their number c; then the n runs' schedule ids, group after group; then their n next
-- entries ("<id>|<record>"), in the same order; then (schedule id, error text) of each failed
-- run, to the end. (The ids come together, so that HMGET takes them straight from ARGV, with
-- no table built per run.)
-- Returns n when every run settled as the worker built it (the common case: no reply item
-- per run to build and send); else per run: 1 settled, 0 refused, or "<due ms>|<entry>" to
-- send again into that slot

local n, d = tonumber(ARGV[2]), tonumber(ARGV[3])
local g = #KEYS - 7 - d
local id0 = d + 4 + 3 * g  -- ARGV[id0 + i - 1]: the i-th run's schedule id
local e0 = id0 + n         -- ARGV[e0 + i - 1]: its next entry
local at_slot = n > 0 and redis.call('HMGET', KEYS[1], unpack(ARGV, id0, e0 - 1)) or {}
local slow, run = false, 0
for h = d + 4, id0 - 1, 3 do
  local from = ARGV[h]
  for i = run + 1, run + tonumber(ARGV[h + 2]) do
    if at_slot[i] ~= from then slow = true end
  end
  run = run + tonumber(ARGV[h + 2])
end
if d > 0 then
  local lists, lots = {unpack(KEYS, 8, 7 + d)}, {unpack(ARGV, 4, 3 + d)}
  redis.call('DEL', unpack(lists))
  redis.call('HDEL', KEYS[5], unpack(lots))
end
local changes = false
if n > 0 and redis.call('EXISTS', KEYS[3]) == 1 then
  changes = redis.call('HMGET', KEYS[3], unpack(ARGV, id0, e0 - 1))
  for i = 1, n do
    if changes[i] then slow = true end
  end
end

-- Per run (slow path only): 1 settled, 0 refused, or the entry to send again.
local out = {}
-- In the slow path: the settled runs of removed schedules (`gone`), and the ids whose error is
-- still their schedule's (`kept`).
local marks, where, gone, kept, w, m = {}, {}, {}, {}, 0, 0
run = 0
for j = 1, g do
  local h = d + 1 + 3 * j
  local from, ms, c = ARGV[h], ARGV[h + 1], tonumber(ARGV[h + 2])
  if not slow then
    -- Every run settles as the worker built it: one push for the slot's entries.
    redis.call('RPUSH', KEYS[7 + d + j], unpack(ARGV, e0 + run, e0 + run + c - 1))
    for i = id0 + run, id0 + run + c - 1 do
      where[w + 1], where[w + 2], w = ARGV[i], ms, w + 2
    end
    run = run + c
    marks[m + 1], marks[m + 2], m = ms, ms, m + 2
  else
    local push = {}
    for _ = 1, c do
      run = run + 1
      local id = ARGV[id0 + run - 1]
      out[run] = 0
      if at_slot[run] == from then
        local entry, reply, removed = settle_entry(id, ARGV[e0 + run - 1],
          changes and changes[run], KEYS[3], KEYS[7], KEYS[1])
        out[run] = reply
        if removed then
          gone[#gone + 1] = id
        elseif entry then
          push[#push + 1] = entry
          where[w + 1], where[w + 2], w = id, ms, w + 2
        end
        if reply == 1 and not removed then kept[id] = true end
      end
    end
    if #push > 0 then
      redis.call('RPUSH', KEYS[7 + d + j], unpack(push))
      marks[m + 1], marks[m + 2], m = ms, ms, m + 2
    end
  end
end
if slow then
  call_many('HDEL', KEYS[1], gone)
  call_many('HDEL', KEYS[3], gone)
end
call_many('HSET', KEYS[1], where)
if m > 0 then redis.call('ZADD', KEYS[2], 'NX', unpack(marks)) end
-- Errors of the runs settled (a refused run's is not its schedule's any more; a removed
-- schedule has none).
local faults = {}
for i = e0 + n, #ARGV - 1, 2 do
  if not slow or kept[ARGV[i]] then
    faults[#faults + 1], faults[#faults + 2] = ARGV[i], ARGV[i + 1]
  end
end
call_many('HSET', KEYS[4], faults)
local settled = n
if slow then
  settled = 0
  for i = 1, n do
    if out[i] == 1 then settled = settled + 1 end
  end
end
if settled > 0 and redis.call('HINCRBY', KEYS[6], ARGV[1], string.format('%d', -settled)) <= 0 then
  redis.call('HDEL', KEYS[6], ARGV[1])
end
if slow then return out end
return n
