-- Adds jobs of one queue that wait for other jobs of the shard (docs/workflows.md): each waits
-- in `deps` until its dependencies ended, or is queued at once when none is left, or is
-- dead-lettered at once when one failed or was cancelled (unless it allowed that one to fail).
--
-- KEYS[1] jobs (hash)  KEYS[2] seq (string)
-- KEYS[3] queues (set: the queues other than the default one that jobs were sent to)
-- KEYS[4] uniqfor (hash)  KEYS[5] uniqends (zset): a dedup key whose unique_for window has not
--         ended is taken, as in enqueue.lua (these jobs open no window of their own)
-- KEYS[6..] the workflow keys (_workflows.lua: workflow_keys), with the queue's ready and wake
-- ARGV[1] the queue's name, empty for the default queue
-- ARGV[2] outcome ttl ms of a job dead-lettered here
-- ARGV    then per job: id, spec, priority, dedup key (may be empty), n, then n dependencies,
--         each "<1 if it may fail, else 0><job id>"
-- Returns {0, id_1, created_1, ...} as enqueue.lua does (an existing job's id when the dedup
--         key is taken), or the error "DEPENDENCY_UNKNOWN <id>", writing nothing, when a
--         dependency is no job of this call, has no state and no outcome kept (unknown, or
--         ended and its outcome expired or was never kept).
local queue = ARGV[1]
local w = workflow_keys(5, {queue == '' and 'default' or queue}, tonumber(ARGV[2]))
local jobs, i = {}, 3
while i <= #ARGV do
  local n = tonumber(ARGV[i + 4])
  jobs[#jobs + 1] = {id = ARGV[i], spec = ARGV[i + 1], priority = tonumber(ARGV[i + 2]),
                     key = ARGV[i + 3], deps = {unpack(ARGV, i + 5, i + 4 + n)}}
  i = i + 5 + n
end
-- Every dependency must be known before anything is written (a job of this call counts).
local here = {}
for _, job in ipairs(jobs) do
  for _, dep in ipairs(job.deps) do
    local id = string.sub(dep, 2)
    if not here[id] and not dependency_state(w, id) then
      return redis.error_reply('DEPENDENCY_UNKNOWN ' .. id)
    end
  end
  here[job.id] = true
end
if queue ~= '' then redis.call('SADD', KEYS[3], queue) end
local seq = redis.call('INCRBY', KEYS[2], #jobs) - #jobs
local out, alias, now = {0}, {}, nil
local windows = nil
for _, job in ipairs(jobs) do
  local existing = job.key ~= '' and redis.call('HGET', w.uniq, job.key)
  if job.key ~= '' and not existing then
    if windows == nil then windows = redis.call('EXISTS', KEYS[5]) == 1 end
    local ends = windows and redis.call('ZSCORE', KEYS[5], job.key)
    now = now or now_ms()
    if ends and tonumber(ends) > now then existing = redis.call('HGET', KEYS[4], job.key) end
  end
  if existing then
    alias[job.id] = existing  -- a later job of this call waits for the job that holds the key
    out[#out + 1] = existing
    out[#out + 1] = 0
  else
    seq = seq + 1
    redis.call('HSET', KEYS[1], KEEP_FIELD, KEEP_VALUE, job.id, job.spec)
    redis.call('HSET', w.state, KEEP_FIELD, KEEP_VALUE, job.id,
      format_state({attempt = 0, stalls = 0, priority = job.priority, seq = seq, unknown = 0,
                    queue = queue, key = job.key}))
    if job.key ~= '' then redis.call('HSET', w.uniq, job.key, job.id) end
    local live, failed, how, through = {}, nil, nil, {}
    for _, dep in ipairs(job.deps) do
      local id = string.sub(dep, 2)
      id = alias[id] or id
      local state = dependency_state(w, id)
      if state == DEP_LIVE then
        live[#live + 1] = {id, string.sub(dep, 1, 1)}
      elseif state ~= DEP_OK and string.sub(dep, 1, 1) ~= '1' then
        if not failed then failed, how = id, state end
        through[#through + 1] = state == DEP_FAILED and id
      end
    end
    -- A dependent dead-lettered here is an orphan of its dead-lettered dependencies (a retry
    -- of them brings it back): then the live ones get their edges, to count down its wait.
    local edges = not failed
    if failed then
      now = now or now_ms()
      bury_dependent(w, job.id, failed, how, now)
      edges = keep_orphan(w, job.id, #live, through)
    elseif #live == 0 then
      now = now or now_ms()
      release_dependent(w, job.id, now)
    else
      redis.call('HSET', w.deps, job.id, string.format('%d', #live))
    end
    if edges then
      for _, dep in ipairs(live) do
        local e = redis.call('HINCRBY', w.dependents, dep[1], '1')
        redis.call('HSET', w.edges, dep[1] .. '|' .. e, dep[2] .. job.id)
      end
    end
    out[#out + 1] = job.id
    out[#out + 1] = 1
  end
end
for q, was in pairs(w.before) do
  wake(w.wakes[q])
  signal_if_better(w.readies[q], w.signals, was, queue)
end
return out
