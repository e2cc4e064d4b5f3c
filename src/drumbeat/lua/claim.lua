-- Claims up to `limit` runnable items for one worker: promotes what is due (delayed jobs and
-- schedules' next runs), pops the best of `ready` by priority, and gives each a lease and a
-- fresh fencing token. Records the lateness of every schedule run it starts.
--
-- KEYS[1] ready (zset)  KEYS[2] due (zset)    KEYS[3] jobs (hash)   KEYS[4] state (hash)
-- KEYS[5] owners (hash) KEYS[6] leases (zset) KEYS[7] fence (string) KEYS[8] seq (string)
-- KEYS[9] wake (zset)   KEYS[10] schedules (hash) KEYS[11] lateness (hash)
-- ARGV[1] worker id   ARGV[2] limit   ARGV[3] lease_ms   ARGV[4] most due entries to promote
-- Returns {now_ms, next_due_ms or -1, then per item: id, spec or false, attempt, stalls, token,
--          priority, extra}; for a schedule run the id is "s:<schedule id>", the spec is the
--          stored schedule and extra is "<due>:<grid>:<generation>:<manual>"
local now = now_ms()
local worker, limit, lease_ms = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])

local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'WITHSCORES', 'LIMIT', 0,
  tonumber(ARGV[4]))
if #due > 0 then
  local members = {}
  for i = 1, #due, 2 do members[#members + 1] = due[i] end
  local states = redis.call('HMGET', KEYS[4], unpack(members))
  local seq = redis.call('INCRBY', KEYS[8], #members) - #members
  for i, member in ipairs(members) do
    local s
    local schedule_id = run_schedule_id(member)
    if schedule_id then
      local sched = parse_schedule(redis.call('HGET', KEYS[10], schedule_id))
      if sched and not sched.paused then
        s = {attempt = 0, stalls = 0, priority = sched.priority, key = string.format(
          '%d:%d:%d:0', tonumber(due[i * 2]), sched.grid, sched.gen)}
      end
    else
      s = parse_state(states[i])
    end
    if s then
      s.seq = seq + i
      redis.call('HSET', KEYS[4], member, format_state(s))
      redis.call('ZADD', KEYS[1], ready_score(s.priority, s.seq), member)
    end
  end
  redis.call('ZREM', KEYS[2], unpack(members))
end

local out = {now, -1}
if limit > 0 then
  local popped = redis.call('ZPOPMIN', KEYS[1], limit)
  local n = #popped / 2
  if n > 0 then
    local ids, job_ids, schedule_ids = {}, {}, {}
    for i = 1, n do
      local id = popped[i * 2 - 1]
      ids[i] = id
      local schedule_id = run_schedule_id(id)
      if schedule_id then schedule_ids[#schedule_ids + 1] = schedule_id
      else job_ids[#job_ids + 1] = id end
    end
    local specs = {}
    if #job_ids > 0 then
      local found = redis.call('HMGET', KEYS[3], unpack(job_ids))
      for i, id in ipairs(job_ids) do specs[id] = found[i] end
    end
    if #schedule_ids > 0 then
      local found = redis.call('HMGET', KEYS[10], unpack(schedule_ids))
      for i, id in ipairs(schedule_ids) do specs[RUN_PREFIX .. id] = found[i] end
    end
    local states = redis.call('HMGET', KEYS[4], unpack(ids))
    local token = redis.call('INCRBY', KEYS[7], n) - n
    local deadline = now + lease_ms
    local lateness = {}
    for i, id in ipairs(ids) do
      token = token + 1
      local s = parse_state(states[i])
      s.attempt = s.attempt + 1
      redis.call('HSET', KEYS[4], id, format_state(s))
      redis.call('HSET', KEYS[5], id, string.format('%d|%s|%d', token, worker, now))
      redis.call('ZADD', KEYS[6], deadline, id)
      if s.attempt == 1 and specs[id] and run_schedule_id(id) then
        local run_due = tonumber(string.match(s.key, '^(%-?%d+):'))
        if run_due then lateness[#lateness + 1] = math.max(0, now - run_due) end
      end
      out[#out + 1] = id
      out[#out + 1] = specs[id]
      out[#out + 1] = s.attempt
      out[#out + 1] = s.stalls
      out[#out + 1] = token
      out[#out + 1] = s.priority
      out[#out + 1] = s.key
    end
    record_lateness(KEYS[11], now, lateness)
  end
end

-- One marker woke this worker; pass it on so work left behind does not wait for a timeout.
if redis.call('ZCARD', KEYS[1]) > 0 then wake(KEYS[9]) end
local head = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
if head[2] then out[2] = tonumber(head[2]) end
return out
