-- Workflow helpers (docs/workflows.md), prepended like _lib.lua's to the scripts that use them.
-- A job enqueued with dependencies (enqueue_after.lua) waits in `deps` (job id -> how many of
-- its dependencies have not ended), in no queue, so no claim sees it. `dependents` counts the
-- jobs waiting for each job, and `edges` names them, one field each ("<job id>|<i>" -> "<allow
-- failure: 1 or 0><dependent id>", i = 1..count), so adding one costs O(1) however many there
-- are. Whatever script ends a job (complete, bury, cancel, reap) settles its dependents in the
-- same call, so no crash between the two can lose or repeat a release, and a settle refused
-- by fencing releases nothing.
--
-- `w`, the keys and names a settle needs: deps, dependents, edges, state, uniq, dead, errors,
-- results, expires, freed, signals (keys); names, readies, wakes (queue names as queue_index
-- takes them, the default one first, and their `ready` and `wake` keys); ttl_ms (outcome TTL of
-- the dependents dead-lettered here); before = {} and buried = {} (filled here).

-- Outcomes of a dependency as a dependent sees them.
local DEP_LIVE = 'live'
local DEP_OK = 'ok'
local DEP_FAILED = 'failed'
local DEP_CANCELLED = 'cancelled'

-- Where `id` stands as a dependency: live (it has a state and is not dead), ok, failed or
-- cancelled (its outcome says so, or it is dead-lettered), or nil: unknown, or its outcome was
-- not kept or has expired.
local function dependency_state(w, id)
  if redis.call('ZSCORE', w.dead, id) then return DEP_FAILED end
  if redis.call('HEXISTS', w.state, id) == 1 then return DEP_LIVE end
  local outcome = redis.call('HGET', w.results, id)
  if not outcome then return nil end
  local decoded, record = pcall(function()
    if string.sub(outcome, 1, 1) == '{' then return cjson.decode(outcome) end
    return cmsgpack.unpack(outcome)
  end)
  if decoded and type(record) == 'table' then
    if record.ok == true then return DEP_OK end
    if record.cancelled == true then return DEP_CANCELLED end
  end
  return DEP_FAILED
end

-- Queues a dependent none of whose dependencies is left: in its queue's `ready` at its place
-- (priority, then its enqueue's order), or in `freed` when its queue's keys were not given
-- (reap.lua, which is given every queue, moves it on).
local function release_dependent(w, id, now)
  redis.call('HDEL', w.deps, id)
  local s = parse_state(redis.call('HGET', w.state, id))
  local q = queue_index(w.names, s.queue)
  if q then
    if not w.before[q] then w.before[q] = ready_priority(w.readies[q]) end
    redis.call('ZADD', w.readies[q], ready_score(s.priority, s.seq), id)
  else
    redis.call('ZADD', w.freed, now, id)
  end
end

-- Dead-letters a waiting dependent at once, its error naming the dependency that failed or
-- was cancelled; its record stays, as a buried job's does, for `drumbeat dead retry`.
local function bury_dependent(w, id, dep, how, now)
  redis.call('HDEL', w.deps, id)
  local s = parse_state(redis.call('HGET', w.state, id))
  release_key(w.uniq, id, s.key)
  local said = how == DEP_CANCELLED and 'was cancelled' or 'failed (dead-lettered)'
  local err = cjson.encode({ok = false, error = 'dependency ' .. dep .. ' ' .. said,
    dependency = dep, attempt = s.attempt, at_ms = now})
  redis.call('ZADD', w.dead, now, id)
  redis.call('HSET', w.errors, id, err)
  if w.ttl_ms > 0 then
    redis.call('HSET', w.results, id, err)
    redis.call('ZADD', w.expires, now + w.ttl_ms, id)
  end
  w.buried[#w.buried + 1] = id
end

-- Settles the dependents of `first`, which ended as `how` (ok, failed, cancelled): each is
-- released once none of its dependencies is left, or dead-lettered when one failed (unless
-- it allowed that one to fail), which in turn settles its own dependents (a worklist, not
-- recursion: a long chain fails in one call).
local function settle_dependents(w, first, how, now)
  local todo, i = {{first, how}}, 1
  while todo[i] do
    local id, ended = todo[i][1], todo[i][2]
    i = i + 1
    local n = tonumber(redis.call('HGET', w.dependents, id))
    if n then
      redis.call('HDEL', w.dependents, id)
      for from = 1, n, CALL_MANY_CHUNK do
        local fields = {}
        for e = from, math.min(n, from + CALL_MANY_CHUNK - 1) do fields[#fields + 1] = id .. '|' .. e end
        local who = redis.call('HMGET', w.edges, unpack(fields))
        redis.call('HDEL', w.edges, unpack(fields))
        for _, edge in ipairs(who) do
          local x = edge and string.sub(edge, 2)
          local left = x and tonumber(redis.call('HGET', w.deps, x))
          if left then  -- else cancelled or dead-lettered while it waited
            if ended == DEP_OK or string.sub(edge, 1, 1) == '1' then
              if left <= 1 then
                release_dependent(w, x, now)
              else
                redis.call('HSET', w.deps, x, string.format('%d', left - 1))
              end
            else
              bury_dependent(w, x, id, ended, now)
              todo[#todo + 1] = {x, DEP_FAILED}
            end
          end
        end
      end
    end
  end
end

-- Settles the dependents of `ids`, which all ended as `how`: one read of `dependents` for the
-- lot (most jobs have none), then the wake-ups and signals of the queues released into.
local function settle_ended(w, ids, how, now)
  for from = 1, #ids, CALL_MANY_CHUNK do
    local counts = redis.call('HMGET', w.dependents,
      unpack(ids, from, math.min(#ids, from + CALL_MANY_CHUNK - 1)))
    for j, count in ipairs(counts) do
      if count then settle_dependents(w, ids[from + j - 1], how, now) end
    end
  end
  for q, was in pairs(w.before) do
    wake(w.wakes[q])
    signal_if_better(w.readies[q], w.signals, was, q == 1 and '' or w.names[q])
  end
  w.before = {}
end

-- `w` from KEYS[base + 1 ..] as scripts.py passes them (`Scripts._workflow_keys`): deps,
-- dependents, edges, freed, dead, errors, results, expires, state, uniq, signals, then the
-- ready and wake keys of each queue in `names` (queue names, the default one first).
local WORKFLOW_KEYS = 11
local function workflow_keys(base, names, ttl_ms)
  local w = {deps = KEYS[base + 1], dependents = KEYS[base + 2], edges = KEYS[base + 3],
             freed = KEYS[base + 4], dead = KEYS[base + 5], errors = KEYS[base + 6],
             results = KEYS[base + 7], expires = KEYS[base + 8], state = KEYS[base + 9],
             uniq = KEYS[base + 10], signals = KEYS[base + 11], names = names, readies = {},
             wakes = {}, ttl_ms = ttl_ms, before = {}, buried = {}}
  for q = 1, #names do
    w.readies[q] = KEYS[base + WORKFLOW_KEYS + 2 * q - 1]
    w.wakes[q] = KEYS[base + WORKFLOW_KEYS + 2 * q]
  end
  return w
end
