-- Opens a batch, or adds members to one that has not ended (docs/workflows.md, batches). Sent
-- in one MULTI after the enqueue calls of its members (enqueue.lua, enqueue_after.lua), so no
-- member can end before it is counted; a member this call finds no state of (its enqueue call
-- failed) is not counted. An add refused takes those members back out (nothing of them stays).
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
-- ARGV    then the member ids
-- Returns how many members were counted, or the error "BATCH_ENDED <id>" / "BATCH_CANCELLED
--         <id>" / "BATCH_UNKNOWN <id>" naming the batch added to (or nested in)
local bid, mode, parent, nq = ARGV[1], ARGV[2], ARGV[6], tonumber(ARGV[7])
local names = {unpack(ARGV, 8, 7 + nq)}
local w = workflow_keys(3, names, tonumber(ARGV[5]))
local dues = {}
for q = 1, nq do dues[q] = KEYS[3 + WORKFLOW_KEYS + 2 * nq + q] end
local c = tonumber(ARGV[8 + nq])
local at = 9 + nq + 5 * c
local now = now_ms()

-- Takes back the copy of member `id` this call's enqueue wrote (a dead one keeps its record).
local function take_back(id)
  local q = queue_index(names, parse_state(redis.call('HGET', w.state, id)).queue)
  if q then
    redis.call('ZREM', w.readies[q], id)
    redis.call('ZREM', dues[q], id)
  end
  if not redis.call('ZSCORE', w.dead, id) then
    redis.call('HDEL', KEYS[1], id)
    redis.call('HDEL', w.state, id)
  end
end

-- The client runs the MULTI again when its reply was lost (redis-py retries a connection
-- error): this call is then a repeat when the batch it opens exists, or when one of its
-- members is counted already or has ended. A repeat counts nothing again: the members that
-- ended since are taken back (their enqueue wrote them anew), the others were written again
-- as they were.
local repeated = mode == 'new' and redis.call('HEXISTS', w.batches, bid) == 1
for i = at, #ARGV do
  if repeated or mode == 'new' then break end
  local id = ARGV[i]
  repeated = redis.call('HGET', w.members, id) == bid or redis.call('ZSCORE', w.dead, id)
    or redis.call('HEXISTS', w.results, id) == 1
end
if repeated then
  for i = at, #ARGV do
    if redis.call('HGET', w.members, ARGV[i]) ~= bid then take_back(ARGV[i]) end
  end
  return #ARGV - at + 1
end

-- Members may join a batch until it ended (a member may add to its own batch while it runs).
local function refusal(id)
  local h = batch_head(w, id)
  return (not h and 'BATCH_UNKNOWN') or (h.state == 'x' and 'BATCH_CANCELLED')
    or (redis.call('HEXISTS', w.batches, id .. '|end') == 1 and 'BATCH_ENDED')
end

local joins = mode == 'add' and bid or (parent ~= '' and parent)
local refused = joins and refusal(joins)
if refused then
  for i = at, #ARGV do take_back(ARGV[i]) end
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
  if parent ~= '' then
    nested[#nested + 1] = bid
    for _, id in ipairs(nested) do redis.call('HSET', w.members, id, parent) end
    redis.call('HINCRBY', w.batches, parent .. '|n', string.format('%d', #nested))
    redis.call('HINCRBY', w.batches, parent .. '|left', string.format('%d', #nested))
  end
end

local pairs_ = {}
for from = at, #ARGV, CALL_MANY_CHUNK do  -- one HMGET per chunk, not a call per member
  local last = math.min(#ARGV, from + CALL_MANY_CHUNK - 1)
  local states = redis.call('HMGET', w.state, unpack(ARGV, from, last))
  for j = 1, last - from + 1 do
    if states[j] then
      pairs_[#pairs_ + 1] = ARGV[from + j - 1]
      pairs_[#pairs_ + 1] = bid
    end
  end
end
local k = #pairs_ / 2
call_many('HSET', w.members, pairs_)
redis.call('HINCRBY', w.batches, bid .. '|n', string.format('%d', k))
redis.call('HINCRBY', w.batches, bid .. '|left', string.format('%d', k))
end_batch_if_done(w, bid, now)  -- closed with no member: it ends here
settle_todo(w, now)
wake_released(w)
return k
