-- Settles the runs of schedules that ran as jobs (queue_runs.lua queued them: limited or
-- routed) and puts each schedule's next entry, which the worker built from the record the run
-- was claimed with, into the slot of its next run, in the same atomic step: a run is never
-- lost from its schedule nor doubled. Fenced like complete.lua: a run whose claim's token no
-- longer matches (its lease lapsed and it was queued again) is refused. A change made while
-- the run was queued or running (`pending`) is applied as settle_slots.lua applies it: a
-- removed schedule is dropped, a paused one waits in `paused`, and a changed one is answered
-- with its entry for the new definition's first slot, whose key was not passed: the run keeps
-- its claim, and the worker sends it again.
--
-- KEYS[1] owners (hash)  KEYS[2] leases (zset)  KEYS[3] jobs (hash)  KEYS[4] state (hash)
-- KEYS[5] where (hash)  KEYS[6] slots (zset)  KEYS[7] pending (hash)  KEYS[8] paused (hash)
-- KEYS[9] faults (hash)
-- KEYS[9 + i] slot:<ms> of the i-th run's next slot
-- ARGV    5 per run: "s:<schedule id>", token, the ms of its next slot, its next entry
--         ("<id>|<record>"), the run's error (empty: none)
-- Returns per run: 1 settled, 0 refused (lease lost), or "<due ms>|<entry>" to send again
-- into that slot
local n = #ARGV / 5
local members, ids = {}, {}
for i = 1, n do
  members[i] = ARGV[5 * i - 4]
  ids[i] = string.sub(members[i], 3)
end
local owners = redis.call('HMGET', KEYS[1], unpack(members))
local changes = redis.call('HMGET', KEYS[7], unpack(ids))
local out, ended = {}, {}
for i = 1, n do
  local a, id = 5 * i - 4, ids[i]
  if not holds(owners[i], ARGV[a + 1]) then
    out[i] = 0
  else
    local entry, reply, removed =
      settle_entry(id, ARGV[a + 3], changes[i], KEYS[7], KEYS[8], KEYS[5])
    out[i] = reply
    if reply == 1 then
      ended[#ended + 1] = members[i]
      if removed then
        redis.call('HDEL', KEYS[5], id)
        redis.call('HDEL', KEYS[7], id)
      else
        if entry then
          local ms = ARGV[a + 2]
          redis.call('RPUSH', KEYS[9 + i], entry)
          redis.call('ZADD', KEYS[6], 'NX', ms, ms)
          redis.call('HSET', KEYS[5], id, ms)
        end
        if ARGV[a + 4] ~= '' then redis.call('HSET', KEYS[9], id, ARGV[a + 4]) end
      end
    end
  end
end
drop_claims(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ended)
return out
