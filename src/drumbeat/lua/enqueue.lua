-- Adds jobs of one queue: records them, then queues each in the queue's `ready` (now) or `due`
-- (later). Bulk-safe.
--
-- KEYS[1] ready  (zset)  KEYS[2] due (zset)  KEYS[3] jobs (hash)  KEYS[4] state (hash)
-- KEYS[5] uniq   (hash)  KEYS[6] seq (string) KEYS[7] wake (zset)
-- KEYS[8] signals (pub/sub channel: told when the best priority waiting rises, or when a
--         delayed job above the lowest priority becomes the next one due)
-- KEYS[9] queues (set: the queues other than the default one that jobs were sent to)
--         (ready, due and wake are the queue's own: `ready`, or `ready:<queue>`)
-- ARGV[1] the queue's name, empty for the default queue
-- ARGV    then groups of 6, one per job: id, spec, priority, delay_ms, at_ms, dedupkey
--         (at_ms > 0 is an absolute run time in epoch ms; else delay_ms after Redis' now;
--          dedupkey may be empty)
-- Returns {now_ms, id_1, created_1, id_2, created_2, ...}: the id of each job (an existing
--         job's id when its dedup key is taken) and 1 if it was created, 0 if deduplicated;
--         now_ms is 0 when no job was delayed (Redis' clock is read only when needed).
--
-- Lean on purpose: enqueueing one job is the producer's hot path and most of the time from
-- enqueue to start at light load, so a job of the lowest priority that is due now (most jobs)
-- costs no clock read and no look at `ready`'s head.
local queue = ARGV[1]
local n = (#ARGV - 1) / 6
local now, urgent = 0, false
for i = 0, n - 1 do
  if now == 0 and (tonumber(ARGV[i * 6 + 5]) > 0 or tonumber(ARGV[i * 6 + 6]) > 0) then
    now = now_ms()
  end
  if tonumber(ARGV[i * 6 + 4]) > MIN_PRIORITY then urgent = true end
end
if queue ~= '' then redis.call('SADD', KEYS[9], queue) end
local seq = redis.call('INCRBY', KEYS[6], n) - n
local out = {now}
local woke = false
local before, best = urgent and ready_priority(KEYS[1]) or MAX_PRIORITY, -1
for i = 0, n - 1 do
  local id, spec = ARGV[i * 6 + 2], ARGV[i * 6 + 3]
  local priority = tonumber(ARGV[i * 6 + 4])
  local delay_ms, at_ms = tonumber(ARGV[i * 6 + 5]), tonumber(ARGV[i * 6 + 6])
  local key = ARGV[i * 6 + 7]
  local existing = key ~= '' and redis.call('HGET', KEYS[5], key)
  if existing then
    out[#out + 1] = existing
    out[#out + 1] = 0
  else
    seq = seq + 1
    -- Each write carries the KEEP_FIELD of its hash (see there): same call, no extra one.
    redis.call('HSET', KEYS[3], KEEP_FIELD, KEEP_VALUE, id, spec)
    redis.call('HSET', KEYS[4], KEEP_FIELD, KEEP_VALUE, id,
      format_state({attempt = 0, stalls = 0, priority = priority, seq = seq, unknown = 0,
                    queue = queue, key = key}))
    if key ~= '' then redis.call('HSET', KEYS[5], key, id) end
    local run_at = at_ms > 0 and at_ms or now + delay_ms
    if run_at > now then
      redis.call('ZADD', KEYS[2], run_at, id)
      -- Busy workers are not woken, but one whose jobs checkpoint promotes an urgent job
      -- when it comes due (so the signal: it cannot lend for one it has not heard of).
      if wake_if_head(KEYS[2], KEYS[7], id) and priority > MIN_PRIORITY then
        redis.call('PUBLISH', KEYS[8], 'd' .. run_at)
      end
    else
      redis.call('ZADD', KEYS[1], ready_score(priority, seq), id)
      woke = true
      if priority > best then best = priority end
    end
    out[#out + 1] = id
    out[#out + 1] = 1
  end
end
if woke then wake(KEYS[7]) end
-- Told only when the best waiting rose (see signal_if_better; `before` is MAX_PRIORITY, so
-- nothing is told, when no job here outranks the lowest priority).
if best > before then redis.call('PUBLISH', KEYS[8], ready_signal(best, queue)) end
return out
