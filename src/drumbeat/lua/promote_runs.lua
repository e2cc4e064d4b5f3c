-- Takes the due runs out of some schedule buckets (a claim reported the buckets; it cannot open
-- them itself, since their keys were not known before it ran) and claims up to `limit` runs for
-- this worker: straight from the buckets when nothing waits in `ready`, the rest left due in
-- their buckets for any worker, else through `ready`, where priority decides, the rest waiting
-- there (see promote_buckets). Each run gets its state (due time, grid slot, generation), so from
-- here on it is leased, fenced, reaped and claimed like a job. A schedule is out of its bucket
-- while its run is queued or in flight, so it cannot run twice at once. Each bucket's marker in
-- `due` is re-scored at its new earliest due time.
--
-- KEYS[1] due (zset)     KEYS[2] ready (zset)   KEYS[3] jobs (hash)    KEYS[4] state (hash)
-- KEYS[5] seq (string)   KEYS[6] wake (zset)    KEYS[7] tasks (hash)   KEYS[8] owners (hash)
-- KEYS[9] leases (zset)  KEYS[10] fence (string) KEYS[11] lateness (hash)
-- KEYS[10 + 2r] ready, KEYS[11 + 2r] wake of the r-th other queue runs may go to (see
--          promote_buckets)
-- KEYS[10 + 2n + 2i] wheel:<b> (zset), KEYS[11 + 2n + 2i] schedules:<b> (hash) of the i-th
--          bucket
-- ARGV[1] worker id  ARGV[2] limit  ARGV[3] lease_ms  ARGV[4] number of other queues (n)
-- ARGV[4 + r] the r-th other queue's name  ARGV[4 + n + i] the i-th bucket number
-- Returns what claim.lua returns, with no buckets: {now_ms, next_due_ms or -1, {}, {upcoming
--          markers: see claim.lua}, best priority left in `ready` or -1, items...}
local now = now_ms()
local k = {ready = KEYS[2], jobs = KEYS[3], state = KEYS[4], owners = KEYS[8],
           leases = KEYS[9], fence = KEYS[10], seq = KEYS[5], tasks = KEYS[7], due = KEYS[1],
           routes = routes_from(tonumber(ARGV[4]), 5, 12)}
local c = {worker = ARGV[1], now = now, lease_ms = tonumber(ARGV[3]),
           out = {now, -1, {}, {}, -1}, lateness = {}}
local buckets = {}
local nr = tonumber(ARGV[4])
for i = 1, #ARGV - 4 - nr do
  buckets[i] = {ARGV[4 + nr + i], KEYS[10 + 2 * nr + 2 * i], KEYS[11 + 2 * nr + 2 * i]}
end
if promote_buckets(k, c, buckets, tonumber(ARGV[2]), true) then wake(KEYS[6]) end
record_lateness(KEYS[11], now, c.lateness)
local head = redis.call('ZRANGE', KEYS[1], '0', '0', 'WITHSCORES')
if head[2] then c.out[2] = tonumber(head[2]) end
c.out[4] = upcoming_markers(KEYS[1], now, UPCOMING)
c.out[5] = ready_priority(KEYS[2])
return c.out
