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
-- KEYS[7 + d + j] slot:<ms> of the j-th group's next slot
-- ARGV[1] incarnation  ARGV[2] n (runs)  ARGV[3] d  ARGV[4 .. d + 3] the lots ("<n>:<ms>");
-- then per group j of
-- runs claimed from one slot and due next in one slot: the ms of the slot they were claimed
-- from, the ms of their next slot, their number c, their c schedule ids, then their c next
-- entries ("<id>|<record>"); then (schedule id, error text) of each failed run, to the end
-- Returns per run: 1 settled, 0 refused, or "<due ms>|<entry>" to send again into that slot

local n, d = tonumber(ARGV[2]), tonumber(ARGV[3])
-- Each run's schedule id and the slot it was claimed from, in the order of the entries.
local ids, froms, at = {}, {}, d + 4
for _ = 8 + d, #KEYS do
  local from, c = ARGV[at], tonumber(ARGV[at + 2])
  for i = at + 3, at + 2 + c do
    local n_ids = #ids + 1
    ids[n_ids], froms[n_ids] = ARGV[i], from
  end
  at = at + 3 + 2 * c
end
local at_slot = redis.call('HMGET', KEYS[1], unpack(ids))
local out, slow = {}, false
for i = 1, n do
  if at_slot[i] == froms[i] then out[i] = 1 else out[i] = 0; slow = true end
end
if d > 0 then
  local lists, lots = {unpack(KEYS, 8, 7 + d)}, {unpack(ARGV, 4, 3 + d)}
  redis.call('DEL', unpack(lists))
  redis.call('HDEL', KEYS[5], unpack(lots))
end
local changes = false
if redis.call('EXISTS', KEYS[3]) == 1 then
  changes = redis.call('HMGET', KEYS[3], unpack(ids))
  for i = 1, n do
    if changes[i] and out[i] == 1 then slow = true end
  end
end

-- In the slow path: the settled runs of removed schedules (`gone`), and the ids whose error is
-- still their schedule's (`kept`).
local run, marks, where, gone, kept = 0, {}, {}, {}, {}
at = d + 4
for j = 8 + d, #KEYS do
  local ms, c = ARGV[at + 1], tonumber(ARGV[at + 2])
  local first, last = at + 3 + c, at + 2 + 2 * c
  if not slow then
    -- Every run settles as the worker built it: one push for the slot's entries.
    redis.call('RPUSH', KEYS[j], unpack(ARGV, first, last))
    for _ = 1, c do
      run = run + 1
      where[#where + 1], where[#where + 2] = ids[run], ms
    end
    marks[#marks + 1], marks[#marks + 2] = ms, ms
  else
    local push = {}
    for e = first, last do
      run = run + 1
      local id = ids[run]
      if out[run] == 1 then
        local entry, reply, removed =
          settle_entry(id, ARGV[e], changes and changes[run], KEYS[3], KEYS[7], KEYS[1])
        out[run] = reply
        if removed then
          gone[#gone + 1] = id
        elseif entry then
          push[#push + 1] = entry
          where[#where + 1], where[#where + 2] = id, ms
        end
        if reply == 1 and not removed then kept[id] = true end
      end
    end
    if #push > 0 then
      redis.call('RPUSH', KEYS[j], unpack(push))
      marks[#marks + 1], marks[#marks + 2] = ms, ms
    end
  end
  at = last + 1
end
if slow then
  call_many('HDEL', KEYS[1], gone)
  call_many('HDEL', KEYS[3], gone)
end
call_many('HSET', KEYS[1], where)
if #marks > 0 then redis.call('ZADD', KEYS[2], 'NX', unpack(marks)) end
-- Errors of the runs settled (a refused run's is not its schedule's any more; a removed
-- schedule has none).
local faults = {}
for i = at, #ARGV - 1, 2 do
  if not slow or kept[ARGV[i]] then
    faults[#faults + 1], faults[#faults + 2] = ARGV[i], ARGV[i + 1]
  end
end
call_many('HSET', KEYS[4], faults)
local settled = 0
for i = 1, n do
  if out[i] == 1 then settled = settled + 1 end
end
if settled > 0 and redis.call('HINCRBY', KEYS[6], ARGV[1], string.format('%d', -settled)) <= 0 then
  redis.call('HDEL', KEYS[6], ARGV[1])
end
return out
