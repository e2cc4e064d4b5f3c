-- Workflow helpers (docs/workflows.md), prepended like _lib.lua's to the scripts that use them.
-- A job enqueued with dependencies (enqueue_after.lua) waits in `deps` (job id -> how many of
-- its dependencies have not ended), in no queue, so no claim sees it. `dependents` counts the
-- jobs waiting for each job, and `edges` names them, one field each ("<job id>|<i>" -> "<allow
-- failure: 1 or 0><dependent id>", i = 1..count), so adding one costs O(1) however many there
-- are. Whatever script ends a job (complete, bury, cancel, reap) settles its dependents in the
-- same call, so no crash between the two can lose or repeat a release, and a settle refused
-- by fencing releases nothing.
--
-- A job can also be a member of a batch (docs/workflows.md, batches; batch scripts: lua/
-- *_batch.lua): `members` names its batch while it lives, and its end is counted in the
-- batch's fields of `batches` in the same call, as its dependents are settled.
--
-- A dependent dead-lettered through a dependency that is itself dead-lettered stays findable
-- in `orphans`, so that `drumbeat dead retry` of that dependency (revive.lua) brings it back to
-- wait for it, and the workflow can complete (as RQ's and BullMQ's users expect): see
-- keep_orphan below.
--
-- `w`, the keys and names a settle needs: deps, dependents, edges, state, uniq, dead, errors,
-- results, expires, freed, signals, members, batches, batchttl, batchdone, jobs, progress,
-- orphans, metrics, batchlist (keys); names, readies, wakes (queue names as queue_index takes them, the default one first,
-- and their `ready` and `wake` keys); ttl_ms (outcome TTL of the dependents dead-lettered
-- here); before = {}, buried = {} and todo = {} (filled here).

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

-- The task name of a job's record (JSON or msgpack, as serialization.py writes it), '?' when
-- it has none or it is unreadable (as the dead-letter listing says).
local function task_of(w, id)
  local spec = redis.call('HGET', w.jobs, id)
  if not spec then return '?' end
  local decoded, record = pcall(function()
    if string.sub(spec, 1, 1) == '{' then return cjson.decode(spec) end
    return cmsgpack.unpack(spec)
  end)
  if decoded and type(record) == 'table' and type(record.t) == 'string' then return record.t end
  return '?'
end

-- Dead-letters a waiting dependent at once, its error naming the dependency that failed or
-- was cancelled; its record stays, as a buried job's does, for `drumbeat dead retry`. It is
-- counted in `metrics` as its task's attempt dead-lettered (`drumbeat_jobs_total{outcome=
-- "dead"}`, as worker/tally.py counts a buried attempt; no run time: it never ran), here
-- since no worker settles it.
local function bury_dependent(w, id, dep, how, now)
  redis.call('HDEL', w.deps, id)
  redis.call('HINCRBY', w.metrics, 'j|dead|' .. task_of(w, id), '1')
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

-- `orphans` (hash): "<id>" of a dependent dead-lettered through dependencies that are in the
-- dead set: "<left>|<dead>", how many of its dependencies have not ended (each keeps its edge
-- to it in `edges`) and how many are dead-lettered (each lists it: "<dependency id>|n" their
-- count, "<dependency id>|<i>" the i-th). A dependent one of whose dependencies was cancelled,
-- or failed and is no longer in the dead set, cannot come back: it has no field.

-- Keeps `id`, just dead-lettered, as an orphan of `through` (the dependencies that failed it;
-- false for one that cannot be retried: then it is no orphan), `left` others not ended yet.
-- Returns whether it is kept.
local function keep_orphan(w, id, left, through)
  for _, dep in ipairs(through) do
    if not dep or not redis.call('ZSCORE', w.dead, dep) then return false end
  end
  redis.call('HSET', w.orphans, id, string.format('%d|%d', left, #through))
  for _, dep in ipairs(through) do
    local i = redis.call('HINCRBY', w.orphans, dep .. '|n', '1')
    redis.call('HSET', w.orphans, dep .. '|' .. i, id)
  end
  return true
end

-- An orphan's dependency `dep` ended as `how` (DEP_OK: or failed where it may): one less left;
-- one more dead, listed under `dep`, when it was dead-lettered; else it is an orphan no more.
local function settle_orphan(w, id, dep, how)
  local raw = redis.call('HGET', w.orphans, id)
  if not raw then return end
  local left, dead = string.match(raw, '^(%d+)|(%d+)$')
  left, dead = tonumber(left) - 1, tonumber(dead)
  if how == DEP_OK then
    redis.call('HSET', w.orphans, id, string.format('%d|%d', math.max(left, 0), dead))
  elseif how == DEP_FAILED and redis.call('ZSCORE', w.dead, dep) then
    redis.call('HSET', w.orphans, id, string.format('%d|%d', math.max(left, 0), dead + 1))
    local i = redis.call('HINCRBY', w.orphans, dep .. '|n', '1')
    redis.call('HSET', w.orphans, dep .. '|' .. i, id)
  else
    redis.call('HDEL', w.orphans, id)
  end
end

-- Forgets what `orphans` holds of jobs that leave the dead set for good (purged, or trimmed
-- after dead_ttl): their own field, and the orphans they list, which can no longer come back
-- (they stay dead-lettered, for a retry of their own). O(the orphans they list), once.
local function forget_orphans(w, ids)
  for _, id in ipairs(ids) do
    local n = tonumber(redis.call('HGET', w.orphans, id .. '|n')) or 0
    redis.call('HDEL', w.orphans, id, id .. '|n', id .. '|b')
    for from = 1, n, CALL_MANY_CHUNK do
      local fields = {}
      for e = from, math.min(n, from + CALL_MANY_CHUNK - 1) do fields[#fields + 1] = id .. '|' .. e end
      local listed = redis.call('HMGET', w.orphans, unpack(fields))
      redis.call('HDEL', w.orphans, unpack(fields))
      for _, x in ipairs(listed) do
        if x then redis.call('HDEL', w.orphans, x) end
      end
    end
  end
end

-- A batch's fields in `batches` (the batch id is a job id of its shard; docs/redis-keys.md):
-- "<id>" its head "<state>|<ttl ms>|<on_complete id>|<on_success id>" (state: o open, c closed,
-- x cancelled); "<id>|n" members added, "<id>|left" not yet ended, "<id>|ko" (dead-lettered),
-- "<id>|x" (cancelled); "<id>|f" how many ends did not succeed and "<id>|f<i>" the i-th of
-- them (a member retried from the dead set back into its batch leaves a hole: rejoin_batch,
-- so f >= ko + x); "<id>|end" the ms it ended. The succeeded are n - left - ko - x.
-- batches.py reads the same.
local function batch_head(w, bid)
  local raw = redis.call('HGET', w.batches, bid)
  if not raw then return nil end
  local state, ttl, on_complete, on_success = string.match(raw, '^(%a)|(%d+)|([^|]*)|([^|]*)$')
  return {state = state, ttl = tonumber(ttl), on_complete = on_complete, on_success = on_success}
end

local function write_batch_head(w, bid, h)
  redis.call('HSET', w.batches, bid,
    h.state .. '|' .. string.format('%d', h.ttl) .. '|' .. h.on_complete .. '|' .. h.on_success)
end

-- Ends a batch nothing of which is left and which is closed: releases on_complete, and
-- on_success if every member succeeded (else cancels it: its own dependents settle through
-- `w.todo`), unless the batch was cancelled; its fields expire `ttl` ms from now (reap.lua);
-- its waiters (`Batch.wait`) hear of it on `batchdone`. A batch nested in another is counted
-- there as a member that ended (through `w.todo`: count_member finds it in `members`).
local function end_batch(w, bid, h, now)
  redis.call('HSET', w.batches, bid .. '|end', string.format('%d', now))
  local counts = redis.call('HMGET', w.batches, bid .. '|ko', bid .. '|x')
  local failed = tonumber(counts[1] or '0') + tonumber(counts[2] or '0')
  w.todo[#w.todo + 1] = {bid, h.state == 'x' and DEP_CANCELLED or (failed == 0 and DEP_OK or DEP_FAILED)}
  if h.state ~= 'x' then
    if h.on_complete ~= '' and redis.call('HEXISTS', w.deps, h.on_complete) == 1 then
      release_dependent(w, h.on_complete, now)
    end
    if h.on_success ~= '' and redis.call('HEXISTS', w.deps, h.on_success) == 1 then
      if failed == 0 then
        release_dependent(w, h.on_success, now)
      else
        redis.call('HDEL', w.deps, h.on_success)
        end_cancelled(w, h.on_success, parse_state(redis.call('HGET', w.state, h.on_success)),
          now, w.ttl_ms)
        w.todo[#w.todo + 1] = {h.on_success, DEP_CANCELLED}
      end
    end
  end
  redis.call('ZADD', w.batchttl, now + h.ttl, bid)
  redis.call('PUBLISH', w.batchdone, bid)
end

-- Ends the batch if it is closed, nothing of it is left, and it has not ended yet.
local function end_batch_if_done(w, bid, now)
  local h = batch_head(w, bid)
  if h and h.state ~= 'o' and tonumber(redis.call('HGET', w.batches, bid .. '|left') or '0') <= 0
      and redis.call('HEXISTS', w.batches, bid .. '|end') == 0 then
    end_batch(w, bid, h, now)
  end
end

-- Counts the end of `id` (ok, failed or cancelled) in its batch, if it is a member: O(1),
-- and once, since its `members` field goes here (a stale run's settle never gets this far).
-- `bid`: its batch when the caller read it already (false: not a member), nil: read here. A
-- success costs two commands: the succeeded count is what is left of the others.
local function count_member(w, id, how, now, bid)
  if bid == nil then bid = redis.call('HGET', w.members, id) end
  if not bid then return end
  redis.call('HDEL', w.members, id)
  if how ~= DEP_OK then
    redis.call('HINCRBY', w.batches, bid .. (how == DEP_CANCELLED and '|x' or '|ko'), '1')
    local f = redis.call('HINCRBY', w.batches, bid .. '|f', '1')
    redis.call('HSET', w.batches, bid .. '|f' .. f, id)
    if how == DEP_FAILED and redis.call('ZSCORE', w.dead, id) then  -- a retry may bring it back
      redis.call('HSET', w.orphans, id .. '|b', bid .. '|' .. f)
    end
  end
  if redis.call('HINCRBY', w.batches, bid .. '|left', '-1') <= 0 then
    end_batch_if_done(w, bid, now)
  end
end

-- `orphans` also holds "<id>|b" of a batch member counted as failed while it is in the dead
-- set: "<batch id>|<i>", its batch and its place in the batch's failed list ("<batch id>|f<i>",
-- count_member below). `id` leaves the dead set to run again (revive.lua, adopt_orphans): if
-- its batch has not ended and was not cancelled, it is a member again, pending (its failure
-- uncounted, its place in the failed list emptied), so its next end is counted there once;
-- a batch that ended (its callbacks released) or was cancelled is not reopened: it runs
-- outside it. Returns 1 back in its batch, -1 outside the batch that counted it, 0 no member.
local function rejoin_batch(w, id)
  local raw = redis.call('HGET', w.orphans, id .. '|b')
  if not raw then return 0 end
  redis.call('HDEL', w.orphans, id .. '|b')
  local bid, i = string.match(raw, '^(.*)|(%d+)$')
  local h = batch_head(w, bid)
  if not h or h.state == 'x' or redis.call('HEXISTS', w.batches, bid .. '|end') == 1
      or redis.call('HGET', w.batches, bid .. '|f' .. i) ~= id then
    return -1
  end
  redis.call('HDEL', w.batches, bid .. '|f' .. i)
  redis.call('HINCRBY', w.batches, bid .. '|ko', '-1')
  redis.call('HINCRBY', w.batches, bid .. '|left', '1')
  redis.call('HSET', w.members, id, bid)
  return 1
end

-- `dep` left the dead set to run again (revive.lua): each orphan it lists waits for it once
-- more (an edge, as enqueue_after.lua writes one), and an orphan none of whose dependencies is
-- dead-lettered any longer leaves the dead set to wait in `deps` (not to run at once), its
-- own orphans coming back in turn, and back in its batch if it was a member (rejoin_batch).
-- Its record and state stayed; its dedup key is taken again if free. Returns how many came
-- back, and how many of those were members of a batch that ended (they run outside it).
local function adopt_orphans(w, dep)
  local back, alone, todo, i = 0, 0, {dep}, 1
  while todo[i] do
    local d = todo[i]
    i = i + 1
    local n = tonumber(redis.call('HGET', w.orphans, d .. '|n'))
    redis.call('HDEL', w.orphans, d, d .. '|n')
    for e = 1, n or 0 do
      local id = redis.call('HGET', w.orphans, d .. '|' .. e)
      redis.call('HDEL', w.orphans, d .. '|' .. e)
      local raw = id and redis.call('HGET', w.orphans, id)
      if raw and redis.call('ZSCORE', w.dead, id) then
        local left, dead = string.match(raw, '^(%d+)|(%d+)$')
        left, dead = tonumber(left) + 1, tonumber(dead) - 1
        local c = redis.call('HINCRBY', w.dependents, d, '1')
        redis.call('HSET', w.edges, d .. '|' .. c, '0' .. id)
        if dead > 0 then
          redis.call('HSET', w.orphans, id, string.format('%d|%d', left, dead))
        else
          redis.call('HDEL', w.orphans, id)
          redis.call('ZREM', w.dead, id)
          redis.call('HDEL', w.errors, id)
          redis.call('HDEL', w.results, id)
          redis.call('ZREM', w.expires, id)
          local s = parse_state(redis.call('HGET', w.state, id))
          if s.key ~= '' and redis.call('HSETNX', w.uniq, s.key, id) == 0 then
            s.key = ''
            redis.call('HSET', w.state, id, format_state(s))
          end
          redis.call('HSET', w.deps, id, string.format('%d', left))
          back = back + 1
          if rejoin_batch(w, id) < 0 then alone = alone + 1 end
          todo[#todo + 1] = id
        end
      end
    end
  end
  return back, alone
end

-- Forgets an ended batch whose time is up (reap.lua): its fields, those of the members that
-- did not succeed included (O(those), once), and its entry in `batchlist`.
local function forget_batch(w, bid)
  local f = tonumber(redis.call('HGET', w.batches, bid .. '|f') or '0')
  redis.call('HDEL', w.batches, bid, bid .. '|n', bid .. '|left', bid .. '|ko',
    bid .. '|x', bid .. '|f', bid .. '|end')
  for from = 1, f, CALL_MANY_CHUNK do
    local fields = {}
    for i = from, math.min(f, from + CALL_MANY_CHUNK - 1) do fields[#fields + 1] = bid .. '|f' .. i end
    redis.call('HDEL', w.batches, unpack(fields))
  end
  redis.call('ZREM', w.batchttl, bid)
  redis.call('ZREM', w.batchlist, bid)
end

-- Settles what `w.todo` holds ({id, how} of jobs that ended): counts each in its batch, and
-- releases its dependents once none of their dependencies is left, or dead-letters them when
-- one failed (unless they allowed that one to fail), which in turn settles their own (a
-- worklist, not recursion: a long chain fails in one call; a batch's on_success cancelled
-- joins it too).
local function settle_todo(w, now)
  local todo, i = w.todo, 1
  while todo[i] do
    local id, ended = todo[i][1], todo[i][2]
    i = i + 1
    local bid, n = todo[i - 1][3], todo[i - 1][4]
    count_member(w, id, ended, now, bid)
    if n == nil then n = redis.call('HGET', w.dependents, id) end
    n = tonumber(n)
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
          local allowed = ended == DEP_OK or (edge and string.sub(edge, 1, 1) == '1')
          if left then
            if allowed then
              if left <= 1 then
                release_dependent(w, x, now)
              else
                redis.call('HSET', w.deps, x, string.format('%d', left - 1))
              end
            else
              bury_dependent(w, x, id, ended, now)
              keep_orphan(w, x, left - 1, ended == DEP_FAILED and {id} or {false})
              todo[#todo + 1] = {x, DEP_FAILED}
            end
          elseif x then  -- cancelled, or dead-lettered while it waited: an orphan, maybe
            settle_orphan(w, x, id, allowed and DEP_OK or ended)
          end
        end
      end
    end
  end
  w.todo = {}
end

-- The wake-ups and signals of the queues released into.
local function wake_released(w)
  for q, was in pairs(w.before) do
    wake(w.wakes[q])
    signal_if_better(w.readies[q], w.signals, was, q == 1 and '' or w.names[q])
  end
  w.before = {}
end

-- Settles the jobs `ids`, which all ended as `how`: one read of `dependents` and one of
-- `members` for the lot (most jobs are in neither), then the wake-ups and signals.
local function settle_ended(w, ids, how, now)
  for from = 1, #ids, CALL_MANY_CHUNK do
    local last = math.min(#ids, from + CALL_MANY_CHUNK - 1)
    local counts = redis.call('HMGET', w.dependents, unpack(ids, from, last))
    local batches = redis.call('HMGET', w.members, unpack(ids, from, last))
    for j = 1, last - from + 1 do
      if counts[j] or batches[j] then
        w.todo[#w.todo + 1] = {ids[from + j - 1], how, batches[j], counts[j]}
        settle_todo(w, now)
      end
    end
  end
  wake_released(w)
end

-- `w` from KEYS[base + 1 ..] as scripts.py passes them (`Scripts._workflow_keys`): deps,
-- dependents, edges, freed, dead, errors, results, expires, state, uniq, signals, members,
-- batches, batchttl, batchdone, jobs, progress, orphans, metrics, batchlist, then the ready and
-- wake keys of each queue in `names` (queue names, the default one first).
local WORKFLOW_KEYS = 20
local function workflow_keys(base, names, ttl_ms)
  local w = {deps = KEYS[base + 1], dependents = KEYS[base + 2], edges = KEYS[base + 3],
             freed = KEYS[base + 4], dead = KEYS[base + 5], errors = KEYS[base + 6],
             results = KEYS[base + 7], expires = KEYS[base + 8], state = KEYS[base + 9],
             uniq = KEYS[base + 10], signals = KEYS[base + 11], members = KEYS[base + 12],
             batches = KEYS[base + 13], batchttl = KEYS[base + 14], batchdone = KEYS[base + 15],
             jobs = KEYS[base + 16], progress = KEYS[base + 17], orphans = KEYS[base + 18],
             metrics = KEYS[base + 19], batchlist = KEYS[base + 20], names = names, readies = {},
             wakes = {}, ttl_ms = ttl_ms, before = {}, buried = {}, todo = {}}
  for q = 1, #names do
    w.readies[q] = KEYS[base + WORKFLOW_KEYS + 2 * q - 1]
    w.wakes[q] = KEYS[base + WORKFLOW_KEYS + 2 * q]
  end
  return w
end
