-- Queues time-slot runs as jobs for their one attempt: the runs of a schedule with limits
-- (they wait for them as jobs do, parked, holding no worker slot) or routed to another queue
-- (the workers of that queue run them). Each run is still its claimer's while `where` names the
-- slot it was claimed from (as settle_slots.lua checks); it then becomes job "s:<schedule id>",
-- its job record "<task name>|<schedule record>" (the record as claimed: finish_runs.lua
-- settles it from there), `where` saying it is queued, and leaves the incarnation's count in
-- `busy`. When the worker that claimed it serves the queue (it names itself) and the queue is
-- not paused, the job is taken by that worker at once, with a lease and a fencing token as a
-- claim gives (its run goes on in the slot it holds: no trip through `ready` and a claim);
-- else it waits in the queue's `ready`. The lateness the slot's claim counted for a fresh run
-- is taken back: the claim that starts it counts it (this one, when it takes it; a run back
-- from a lapsed lease was counted when first claimed, and is not again).
--
-- KEYS[1] where (hash)  KEYS[2] jobs (hash)  KEYS[3] state (hash)  KEYS[4] seq (string)
-- KEYS[5] busy (hash)  KEYS[6] lateness (hash)  KEYS[7] queues (set)
-- KEYS[8] ready (zset), KEYS[9] wake (zset) of the queue the runs go to
-- KEYS[10] owners (hash)  KEYS[11] leases (zset)  KEYS[12] fence (string)
-- KEYS[13] progress (hash)  KEYS[14] pauses (set)
-- ARGV[1] incarnation  ARGV[2] the queue's name (empty: the default one)  ARGV[3] the worker
-- that takes the jobs (empty: none, they wait in `ready`)  ARGV[4] lease ms; then 7 per run:
-- schedule id, the ms of the slot it was claimed from, job record, priority, run key
-- ("<due>:<grid>:<generation>:<manual>[:<first start>]"), stalls, the claim's ms
-- Returns {per run: 2 taken, 1 queued, 0 refused (the reaper or a hand-back put it back)}, then
-- per run taken the fields of a claimed item (take_all)
local incarnation, queue, worker = ARGV[1], ARGV[2], ARGV[3]
local first = 5
local n = (#ARGV - first + 1) / 7
local ids = {}
for i = 1, n do ids[i] = ARGV[first + 7 * (i - 1)] end
local at = redis.call('HMGET', KEYS[1], unpack(ids))
local seq = redis.call('INCRBY', KEYS[4], string.format('%d', n)) - n
local out, members, records, states, where = {}, {}, {}, {}, {}
for i = 1, n do
  local a = first + 7 * (i - 1)
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
local reply = {out}
if #members > 0 then
  call_many('HSET', KEYS[1], where)
  local k = {state = KEYS[3], jobs = KEYS[2], owners = KEYS[10], leases = KEYS[11],
             fence = KEYS[12], progress = KEYS[13]}
  local take = worker ~= '' and not paused_set(KEYS[14])[queue == '' and 'default' or queue]
  if take then
    local c = {worker = worker, now = now_ms(), lease_ms = tonumber(ARGV[4]), out = reply,
               lateness = {}}
    local jobs = {KEEP_FIELD, KEEP_VALUE}
    for q, member in ipairs(members) do jobs[2 * q + 1], jobs[2 * q + 2] = member, records[q] end
    call_many('HSET', KEYS[2], jobs)
    take_all(k, c, members, records, states)
    record_lateness(KEYS[6], c.now, c.lateness)
    for i = 1, n do
      if out[i] == 1 then out[i] = 2 end
    end
  else
    queue_all(k, members, records, states, KEYS[8])
    wake(KEYS[9])
  end
  if queue ~= '' then redis.call('SADD', KEYS[7], queue) end
  if redis.call('HINCRBY', KEYS[5], incarnation, string.format('%d', -#members)) <= 0 then
    redis.call('HDEL', KEYS[5], incarnation)
  end
end
return reply
