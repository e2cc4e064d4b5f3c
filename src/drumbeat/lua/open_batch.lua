-- Opens a batch, or adds members to one that has not ended (docs/workflows.md, batches). Sent
-- in one MULTI after the enqueue calls of its members (enqueue.lua, enqueue_after.lua), so no
-- member can end before it is counted. A member with dependencies that its enqueue
-- dead-lettered at once is counted as failed here. If a member other than a keyed one (which
-- may be a duplicate) has no state, its enqueue call was refused: nothing of this call stays.
-- An add refused takes its members back out the same way.
--
-- KEYS[1] jobs (hash)  KEYS[2] seq (string)  KEYS[3] queues (set)
-- KEYS[4..] the workflow keys (_workflows.lua: workflow_keys) with the ready and wake keys of
--         each queue named, then the `due` key of each
-- ARGV[1] batch id  ARGV[2] new or add  ARGV[3] 1: closed at once, 0: open until close_batch
-- ARGV[4] ms its fields are kept after it ended  ARGV[5] outcome ttl ms (a callback cancelled)
-- ARGV[6] the id of the batch it is nested in (new only; empty: none): it counts there as one
--         member, and so does each of its callbacks, so that one ends after them
-- ARGV[7] q, then ARGV[8..7+q] the names of the queues of its members and callbacks (the
--         default one first)
-- ARGV    then c, the number of callbacks, and c groups of 5: role (c: on_complete, s:
--         on_success), id, spec, priority, queue (empty for the default one): each waits in
--         `deps` (held by the batch, as a dependent by its dependencies) until the batch ends
-- ARGV    then the member ids, each "<flag><id>": flag 0 plain, k with a dedup key, d with
--         dependencies
-- Returns how many members were counted, or the error "BATCH_ENDED <id>" / "BATCH_CANCELLED
--         <id>" / "BATCH_UNKNOWN <id>" naming the batch added to (or nested in), or
--         "BATCH_INCOMPLETE <id>" (a member's enqueue was refused: its error comes first)
local bid, mode, parent, nq = ARGV[1], ARGV[2], ARGV[6], tonumber(ARGV[7])
local names = {unpack(ARGV, 8, 7 + nq)}
local w = workflow_keys(3, names, tonumber(ARGV[5]))
local dues = {}
for q = 1, nq do dues[q] = KEYS[3 + WORKFLOW_KEYS + 2 * nq + q] end
local c = tonumber(ARGV[8 + nq])
local now = now_ms()

local ids, flags = {}, {}
for i = 9 + nq + 5 * c, #ARGV do
  ids[#ids + 1] = string.sub(ARGV[i], 2)
  flags[#ids] = string.sub(ARGV[i], 1, 1)
end
local states = {}
for from = 1, #ids, CALL_MANY_CHUNK do  -- one HMGET per chunk, not a call per member
  local last = math.min(#ids, from + CALL_MANY_CHUNK - 1)
  local got = redis.call('HMGET', w.state, unpack(ids, from, last))
  for j = 1, last - from + 1 do states[from + j - 1] = got[j] end
end

-- Takes back the copy of the i-th member this call's enqueue wrote (a dead one keeps its
-- record: it ended, and `drumbeat dead` shows it).
local function take_back(i)
  local id = ids[i]
  local q = queue_index(names, parse_state(states[i]).queue)
  if q then
    redis.call('ZREM', w.readies[q], id)
    redis.call('ZREM', dues[q], id)
  end
  if not redis.call('ZSCORE', w.dead, id) then
    redis.call('HDEL', KEYS[1], id)
    redis.call('HDEL', w.state, id)
    redis.call('HDEL', w.deps, id)  -- its edges go with its dependencies' ends (left, unread)
  end
end

-- The client runs the MULTI again when its reply was lost (redis-py retries a connection
-- error): this call is then a repeat when the batch it opens exists, or when one of its
-- members is counted already or has ended (one with dependencies may have been dead-lettered
-- by this very call's enqueue: only its count tells). A repeat counts nothing again: the
-- members that ended since are taken back (their enqueue wrote them anew), the others were
-- written again as they were.
local repeated = mode == 'new' and redis.call('HEXISTS', w.batches, bid) == 1
for i = 1, #ids do
  if repeated or mode == 'new' then break end
  repeated = redis.call('HGET', w.members, ids[i]) == bid or (flags[i] ~= 'd'
    and (redis.call('ZSCORE', w.dead, ids[i]) or redis.call('HEXISTS', w.results, ids[i]) == 1))
end
if repeated then
  for i = 1, #ids do
    if redis.call('HGET', w.members, ids[i]) ~= bid then take_back(i) end
  end
  return #ids
end

-- Members may join a batch until it ended (a member may add to its own batch while it runs).
local function refusal(id)
  local h = batch_head(w, id)
  return (not h and 'BATCH_UNKNOWN') or (h.state == 'x' and 'BATCH_CANCELLED')
    or (redis.call('HEXISTS', w.batches, id .. '|end') == 1 and 'BATCH_ENDED')
end

local joins = mode == 'add' and bid or (parent ~= '' and parent)
local refused = joins and refusal(joins)
for i = 1, #ids do
  if refused then break end
  if not states[i] and flags[i] ~= 'k' then refused, joins = 'BATCH_INCOMPLETE', bid end
end
if refused then
  for i = 1, #ids do
    if states[i] then take_back(i) end
  end
  return redis.error_reply(refused .. ' ' .. joins)
end

if mode ~= 'add' then
  local h = {state = ARGV[3] == '1' and 'c' or 'o', ttl = tonumber(ARGV[4]), on_complete = '',
             on_success = ''}
  local nested = {}
  for i = 0, c - 1 do
    local role, id, spec = ARGV[9 + nq + 5 * i], ARGV[10 + nq + 5 * i], ARGV[11 + nq + 5 * i]
    local priority, queue = tonumber(ARGV[12 + nq + 5 * i]), ARGV[13 + nq + 5 * i]
    if role == 'c' then h.on_complete = id else h.on_success = id end
    local seq = redis.call('INCR', KEYS[2])
    redis.call('HSET', KEYS[1], KEEP_FIELD, KEEP_VALUE, id, spec)
    redis.call('HSET', w.state, KEEP_FIELD, KEEP_VALUE, id,
      format_state({attempt = 0, stalls = 0, priority = priority, seq = seq, unknown = 0,
                    queue = queue, key = ''}))
    redis.call('HSET', w.deps, id, '1')
    if queue ~= '' then redis.call('SADD', KEYS[3], queue) end
    nested[#nested + 1] = id
  end
  write_batch_head(w, bid, h)
  redis.call('ZADD', w.batchlist, now, bid)  -- listed (`drumbeat batches ls`) until forgotten
  if parent ~= '' then
    nested[#nested + 1] = bid
    for _, id in ipairs(nested) do redis.call('HSET', w.members, id, parent) end
    redis.call('HINCRBY', w.batches, parent .. '|n', string.format('%d', #nested))
    redis.call('HINCRBY', w.batches, parent .. '|left', string.format('%d', #nested))
  end
end

local pairs_ = {}
for i = 1, #ids do
  if states[i] then  -- a keyed member without one was a duplicate: no member
    pairs_[#pairs_ + 1] = ids[i]
    pairs_[#pairs_ + 1] = bid
    -- Dead-lettered by its own enqueue (a dependency had failed): it ended, as a failure.
    if flags[i] == 'd' and redis.call('ZSCORE', w.dead, ids[i]) then
      w.todo[#w.todo + 1] = {ids[i], DEP_FAILED, bid, false}
    end
  end
end
local k = #pairs_ / 2
call_many('HSET', w.members, pairs_)
redis.call('HINCRBY', w.batches, bid .. '|n', string.format('%d', k))
redis.call('HINCRBY', w.batches, bid .. '|left', string.format('%d', k))
settle_todo(w, now)
end_batch_if_done(w, bid, now)  -- closed with no member (or none left): it ends here
settle_todo(w, now)
wake_released(w)
return k
