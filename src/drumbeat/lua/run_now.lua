-- Queues one extra run of each schedule now, unless one is already queued or in flight (a
-- schedule never runs concurrently with itself). Its cadence is kept: after this run, the
-- schedule resumes at the slot it was waiting for. The run goes to its schedule's queue; one
-- routed to a queue whose keys were not passed is not queued.
--
-- KEYS[1] ready (zset)  KEYS[2] leases (zset)  KEYS[3] state (hash)  KEYS[4] seq (string)
-- KEYS[5] wake (zset)   KEYS[6] jobs (hash)    KEYS[7] tasks (hash)
-- KEYS[6 + 2r] ready, KEYS[7 + 2r] wake of the r-th queue other than the default one
-- KEYS[6 + 2n + 2i] wheel:<b> (zset), KEYS[7 + 2n + 2i] schedules:<b> (hash) of the i-th
--         schedule
-- ARGV[1] number of other queues (n), ARGV[1 + r] the r-th one's name, then the schedule ids
-- Returns the number of runs queued.
local now = now_ms()
local nr = tonumber(ARGV[1])
local routes = routes_from(nr, 2, 8)
routes[''] = {ready = KEYS[1], wake = KEYS[5]}
local n = 0
for i = 1, #ARGV - 1 - nr do
  local id = ARGV[1 + nr + i]
  local s = parse_schedule(redis.call('HGET', KEYS[7 + 2 * nr + 2 * i], id))
  local member = RUN_PREFIX .. id
  local queue = s and run_queue(KEYS[7], s.task)
  if s and routes[queue] and not run_in_flight(KEYS[3], member) then
    redis.call('ZREM', KEYS[6 + 2 * nr + 2 * i], id)
    local seq = redis.call('INCR', KEYS[4])
    redis.call('HSET', KEYS[3], member, format_state({attempt = 0, stalls = 0,
      priority = s.priority, seq = seq, queue = queue, unknown = 0,
      key = string.format('%d:%d:%d:1', now, s.grid, s.gen)}))
    local name = redis.call('HGET', KEYS[7], '#' .. s.task) or '?'
    redis.call('HSET', KEYS[6], member, name .. '|' .. s.spec)
    redis.call('ZADD', routes[queue].ready, ready_score(s.priority, seq), member)
    wake(routes[queue].wake)
    n = n + 1
  end
end
return n
