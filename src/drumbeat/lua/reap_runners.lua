-- Takes back the runs of worker process incarnations whose lease in `runners` lapsed (time
-- slots): each run still in flight (`where` names the
-- slot it was claimed from: no settle or hand-back moved it on) goes back into a due slot,
-- at its end (`stalled` counts them there), marked with one more stall, its due time and its
-- first start (so its lateness still counts to its first start, and after max_stalls its next
-- claim counts it failed without running it, as reap.lua does for runs queued as jobs); the
-- incarnation's lots, its `inflight` hash, its entry in `runners` and its count in `busy` go,
-- so its late settles
-- are refused (`where` moved on) and its next claim is told it was reaped. The caller read the
-- lapsed incarnations from `runners` and their lots from their `inflight` hashes first; one
-- renewed since (a claim renews) is left, as is one holding a lot the caller did not pass.
--
-- KEYS[1] runners (zset)  KEYS[2] where (hash)  KEYS[3] slots (zset)  KEYS[4] stalled (hash)
-- KEYS[5] slot:<ms> the runs go back into  KEYS[6] busy (hash); then per incarnation: its
-- inflight:<incarnation>,
-- then claimed:<incarnation>:<lot> of each of the c lots passed
-- ARGV[1] that slot's ms (at or before now: due); then per incarnation: its name, c, the c
-- lots ("<claim number>:<slot ms>")
-- Returns the number of runs taken back
local now = now_ms()
local ms = ARGV[1]
local back, where = {}, {}

-- The runs of one lot still in flight (due: its slot's ms; first: the claim's time),
-- stall-marked, into `back`.
local function take_back(lot_key, due, first)
  local ids, entries = {}, {}
  for _, entry in ipairs(redis.call('LRANGE', lot_key, '0', '-1')) do
    local id = string.match(entry, '^([^|;]+)[|;]')
    if id then ids[#ids + 1], entries[#entries + 1] = id, entry end
  end
  for lo = 1, #ids, CALL_MANY_CHUNK do
    local hi = math.min(lo + CALL_MANY_CHUNK - 1, #ids)
    local at = redis.call('HMGET', KEYS[2], unpack(ids, lo, hi))
    for j = lo, hi do
      if at[j - lo + 1] == due then
        local id, entry, was, since = ids[j], entries[j], due, first
        local stalls, old_due, old_first, record =
          string.match(entry, '^[^|;]+;(%d+);(%d+);(%d+)|(.*)$')
        if stalls then
          stalls, was, since = stalls + 1, old_due, old_first
        else
          stalls, record = 1, entry_record(entry)
        end
        back[#back + 1] = id .. ';' .. stalls .. ';' .. was .. ';' .. since .. '|' .. record
        where[#where + 1], where[#where + 2] = id, ms
      end
    end
  end
end

local a, k = 2, 7
while a <= #ARGV do
  local incarnation, c = ARGV[a], tonumber(ARGV[a + 1])
  local hash_key, passed = KEYS[k], {}
  for i = 1, c do passed[ARGV[a + 1 + i]] = true end
  local lease = redis.call('ZSCORE', KEYS[1], incarnation)
  local held = redis.call('HGETALL', hash_key)
  local complete = true
  for i = 1, #held, 2 do
    if not passed[held[i]] then complete = false end
  end
  if lease and lease + 0 <= now and complete then
    local claimed = {}
    for i = 1, #held, 2 do claimed[held[i]] = held[i + 1] end
    for i = 1, c do
      local lot, lot_key = ARGV[a + 1 + i], KEYS[k + i]
      if claimed[lot] then take_back(lot_key, string.match(lot, ':(%d+)$'), claimed[lot]) end
      redis.call('DEL', lot_key)
    end
    redis.call('DEL', hash_key)
    redis.call('ZREM', KEYS[1], incarnation)
    redis.call('HDEL', KEYS[6], incarnation)
  end
  a, k = a + 2 + c, k + 1 + c
end
if #back > 0 then
  call_many('RPUSH', KEYS[5], back)
  redis.call('HINCRBY', KEYS[4], ms, string.format('%d', #back))
  redis.call('ZADD', KEYS[3], ms, ms)
  call_many('HSET', KEYS[2], where)
end
return #back
