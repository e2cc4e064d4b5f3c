-- Queues time-slot runs as jobs for their one attempt: the runs of a schedule with limits
-- (they wait for them as jobs do, parked, holding no worker slot) or routed to another queue
-- (the workers of that queue run them). Each run is still its claimer's while `where` names the
-- slot it was claimed from (as settle_slots.lua checks); it then waits in its queue's `ready` as
-- "s:<schedule id>", its job record "<task name>|<schedule record>" (the record as claimed:
-- finish_runs.lua settles it from there), `where` saying it is queued, and leaves the
-- incarnation's count in `busy`. The lateness the slot's claim counted for a fresh run is taken
-- back: the claim that starts it counts it (a run back from a lapsed lease was counted when
-- first claimed, and is not again).
--
-- KEYS[1] where (hash)  KEYS[2] jobs (hash)  KEYS[3] state (hash)  KEYS[4] seq (string)
-- KEYS[5] busy (hash)  KEYS[6] lateness (hash)  KEYS[7] queues (set)
-- KEYS[8] ready (zset), KEYS[9] wake (zset) of the queue the runs go to
-- ARGV[1] incarnation  ARGV[2] the queue's name (empty: the default one); then 7 per run:
-- schedule id, the ms of the slot it was claimed from, job record, priority, run key
-- ("<due>:<grid>:<generation>:<manual>[:<first start>]"), stalls, the claim's ms
-- Returns per run: 1 queued, 0 refused (the reaper or a hand-back put it back)
local incarnation, queue = ARGV[1], ARGV[2]
local n = (#ARGV - 2) / 7
local ids = {}
for i = 1, n do ids[i] = ARGV[3 + 7 * (i - 1)] end
local at = redis.call('HMGET', KEYS[1], unpack(ids))
local seq = redis.call('INCRBY', KEYS[4], string.format('%d', n)) - n
local out, members, records, states, where = {}, {}, {}, {}, {}
for i = 1, n do
  local a = 3 + 7 * (i - 1)
  if at[i] == ARGV[a + 1] then
    local stalls = ARGV[a + 5] + 0
    local q = #members + 1
    members[q], records[q] = RUN_PREFIX .. ids[i], ARGV[a + 2]
    -- The claim that starts it counts its attempt: the same as the slot's claim would have.
    states[q] = {attempt = stalls, stalls = stalls, priority = ARGV[a + 3] + 0, seq = seq + i,
                 unknown = 0, queue = queue, key = ARGV[a + 4]}
    where[#where + 1], where[#where + 2] = ids[i], QUEUED_AT
    if stalls == 0 then
      local claimed = ARGV[a + 6] + 0
      unrecord_lateness(KEYS[6], claimed, math.max(0, claimed - ARGV[a + 1]))
    end
    out[i] = 1
  else
    out[i] = 0
  end
end
if #members > 0 then
  call_many('HSET', KEYS[1], where)
  queue_all({state = KEYS[3], jobs = KEYS[2]}, members, records, states, KEYS[8])
  if queue ~= '' then redis.call('SADD', KEYS[7], queue) end
  if redis.call('HINCRBY', KEYS[5], incarnation, string.format('%d', -#members)) <= 0 then
    redis.call('HDEL', KEYS[5], incarnation)
  end
  wake(KEYS[9])
end
return out
