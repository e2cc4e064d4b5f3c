-- PROBE (bench/flat_probe.py), not used by drumbeat: a claim from a flat schedule, one zset of
-- schedules by next run and one hash of their records per shard instead of the wheel's
-- buckets. The same work per run as promote_buckets' path straight from a bucket (default
-- queue, nothing waiting in `ready`): record read, state, owner, lease, fence, lateness; one
-- call per key per batch. Returns a claim reply that replies.parse_claim reads.
-- KEYS[1] sched (zset) KEYS[2] records (hash) KEYS[3] tasks KEYS[4] state KEYS[5] owners
-- KEYS[6] leases KEYS[7] fence KEYS[8] seq KEYS[9] lateness KEYS[10] ready
local now = now_ms()
local limit = tonumber(ARGV[1])
local k = {state = KEYS[4], owners = KEYS[5], leases = KEYS[6], fence = KEYS[7],
           seq = KEYS[8], ready = KEYS[10], tasks = KEYS[3]}
local c = {worker = 'w1', now = now, lease_ms = 60000, out = {now, -1, {}, false, -1},
           lateness = {}}
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now),
  'WITHSCORES', 'LIMIT', '0', ARGV[1])
local found, dues, raw = {}, {}, {}
for j = 1, #due, 2 do
  local m = #found + 1
  found[m], dues[m], raw[m] = due[j], due[j + 1] + 0, due[j + 1]
end
if #found > 0 then
  redis.call('ZREM', KEYS[1], unpack(found))
  local records = redis.call('HMGET', KEYS[2], unpack(found))
  local names, ids, specs, states = {}, {}, {}, {}
  for j, id in ipairs(found) do
    local gen, grid, flags, task, spec = schedule_run_fields(records[j])
    if names[task] == nil then names[task] = redis.call('HGET', k.tasks, '#' .. task) or '?' end
    ids[j] = RUN_PREFIX .. id
    specs[j] = names[task] .. '|' .. spec
    states[j] = {attempt = 0, stalls = 0, priority = flags, seq = 0, due = dues[j], queue = '',
                 unknown = 0, key = raw[j] .. ':' .. grid .. ':' .. gen .. ':0'}
  end
  local seq = redis.call('INCRBY', k.seq, #ids) - #ids
  for i = 1, #ids do states[i].seq = seq + i end
  take_all(k, c, ids, specs, states)
  record_lateness(KEYS[9], now, c.lateness)
end
local head = redis.call('ZRANGE', KEYS[1], '0', '0', 'WITHSCORES')
if head[2] then c.out[2] = head[2] + 0 end
return c.out
