-- Adds jobs of one queue: records them, then queues each in the queue's `ready` (now) or `due`
-- (later). Bulk-safe.
--
-- KEYS[1] ready  (zset)  KEYS[2] due (zset)  KEYS[3] jobs (hash)  KEYS[4] state (hash)
-- KEYS[5] uniq   (hash)  KEYS[6] seq (string) KEYS[7] wake (zset)
-- KEYS[8] signals (pub/sub channel: told when the best priority waiting rises, or when a
--         delayed job above the lowest priority becomes the next one due)
-- KEYS[9] queues (set: the queues other than the default one that jobs were sent to)
--         (ready, due and wake are the queue's own: `ready`, or `ready:<queue>`)
-- KEYS[10] uniqfor (hash: dedup key -> id of the job that took it for a unique_for window)
-- KEYS[11] uniqends (zset: dedup key -> end ms of that window; swept here, bounded)
-- ARGV[1] the queue's name, empty for the default queue
-- ARGV    then groups of 7, one per job: id, spec, priority, delay_ms, at_ms, dedupkey,
--         unique_ms (at_ms > 0 is an absolute run time in epoch ms; else delay_ms after Redis'
--         now; dedupkey may be empty; unique_ms > 0, with a dedupkey: the key stays taken that
--         long from now, even after the job ended)
-- Returns {now_ms, id_1, created_1, id_2, created_2, ...}: the id of each job (an existing
--         job's id when its dedup key is taken: by a live job in `uniq`, or by the job whose
--         unique_for window has not ended) and 1 if it was created, 0 if deduplicated;
--         now_ms is 0 when Redis' clock was not read (it is read only when needed).
--
-- Lean on purpose: enqueueing one job is the producer's hot path and most of the time from
-- enqueue to start at light load, so a job of the lowest priority that is due now (most jobs)
-- costs no clock read and no look at `ready`'s head.
local queue = ARGV[1]
local W = 7
local n = (#ARGV - 1) / W
local now, urgent, keyed, windowed = 0, false, false, false
for i = 0, n - 1 do
  if now == 0 and (tonumber(ARGV[i * W + 5]) > 0 or tonumber(ARGV[i * W + 6]) > 0
                   or tonumber(ARGV[i * W + 8]) > 0) then
    now = now_ms()
  end
  if tonumber(ARGV[i * W + 4]) > MIN_PRIORITY then urgent = true end
  if ARGV[i * W + 7] ~= '' then keyed = true end
  if tonumber(ARGV[i * W + 8]) > 0 then windowed = true end
end
-- Keyed jobs look for a window only if one exists: the check costs nothing otherwise.
local windows = keyed and redis.call('EXISTS', KEYS[11]) == 1
if windows and now == 0 then now = now_ms() end
if windowed then
  -- Ended windows go a few more than this call adds at a time, so the sets stay bounded by
  -- the windows open (plus those ended since the last enqueue that opened one).
  local ended = redis.call('ZRANGEBYSCORE', KEYS[11], '-inf', now, 'LIMIT', '0', n + 16)
  if #ended > 0 then
    redis.call('ZREM', KEYS[11], unpack(ended))
    redis.call('HDEL', KEYS[10], unpack(ended))
  end
end
if queue ~= '' then redis.call('SADD', KEYS[9], queue) end
local seq = redis.call('INCRBY', KEYS[6], n) - n
local out = {0}
local woke = false
local before, best = urgent and ready_priority(KEYS[1]) or MAX_PRIORITY, -1
for i = 0, n - 1 do
  local id, spec = ARGV[i * W + 2], ARGV[i * W + 3]
  local priority = tonumber(ARGV[i * W + 4])
  local delay_ms, at_ms = tonumber(ARGV[i * W + 5]), tonumber(ARGV[i * W + 6])
  local key, unique_ms = ARGV[i * W + 7], tonumber(ARGV[i * W + 8])
  local existing = key ~= '' and redis.call('HGET', KEYS[5], key)
  if not existing and windows then
    local ends = redis.call('ZSCORE', KEYS[11], key)
    if ends and tonumber(ends) > now then existing = redis.call('HGET', KEYS[10], key) end
  end
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
    if unique_ms > 0 and key ~= '' then
      redis.call('HSET', KEYS[10], key, id)
      redis.call('ZADD', KEYS[11], now + unique_ms, key)
      windows = true  -- a later job of this call with the same key is a duplicate too
    end
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
out[1] = now
return out
