-- Takes back the runs of worker process incarnations whose lease in `runners` lapsed (time
-- slots; opt-in: Settings.schedule_store "slots"): each run still in flight (`where` names the
-- slot it was claimed from: no settle or hand-back moved it on) goes back into a due slot
-- marked with one more stall, its due time and its first start (so its lateness still counts
-- to its first start, and after max_stalls its next claim counts it failed without running it,
-- as reap.lua does for the wheel's runs); the incarnation's claim lists, its `inflight` set and
-- its entry in `runners` go, so its late settles are refused (`where` moved on) and its next
-- claim is told it was reaped. The caller read the lapsed incarnations from `runners` and
-- their claim numbers from their `inflight` sets first; one renewed since (a claim renews) is
-- left, as is one holding a claim the caller did not pass.
--
-- KEYS[1] runners (zset)  KEYS[2] where (hash)  KEYS[3] slots (zset)
-- KEYS[4] slot:<ms> the runs go back into; then per incarnation: its inflight:<incarnation>,
-- then claimed:<incarnation>:<n> of each of the c claims passed
-- ARGV[1] that slot's ms (at or before now: due); then per incarnation: its name, c, the c
-- claim numbers
-- Returns the number of runs taken back
local now = now_ms()
local ms = ARGV[1]
local back, where = {}, {}

-- The runs of one claim list still in flight, stall-marked, into `back`.
local function take_back(list_key)
  local ids, entries, dues, firsts = {}, {}, {}, {}
  local due, first = nil, nil
  for _, item in ipairs(redis.call('LRANGE', list_key, '0', '-1')) do
    local d, f = string.match(item, '^#(%d+)|(%d+)$')
    if d then
      due, first = d, f
    else
      local id = string.match(item, '^([^|;]+)[|;]')
      if id and due then
        local n = #ids + 1
        ids[n], entries[n], dues[n], firsts[n] = id, item, due, first
      end
    end
  end
  for lo = 1, #ids, CALL_MANY_CHUNK do
    local hi = math.min(lo + CALL_MANY_CHUNK - 1, #ids)
    local at = redis.call('HMGET', KEYS[2], unpack(ids, lo, hi))
    for j = lo, hi do
      if at[j - lo + 1] == dues[j] then
        local id, entry, was, since = ids[j], entries[j], dues[j], firsts[j]
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

local a, k = 2, 5
while a <= #ARGV do
  local incarnation, c = ARGV[a], tonumber(ARGV[a + 1])
  local set_key, passed = KEYS[k], {}
  for i = 1, c do passed[ARGV[a + 1 + i]] = KEYS[k + i] end
  local lease = redis.call('ZSCORE', KEYS[1], incarnation)
  local complete = true
  for _, number in ipairs(redis.call('SMEMBERS', set_key)) do
    if not passed[number] then complete = false end
  end
  if lease and lease + 0 <= now and complete then
    for i = 1, c do
      take_back(KEYS[k + i])
      redis.call('DEL', KEYS[k + i])
    end
    redis.call('DEL', set_key)
    redis.call('ZREM', KEYS[1], incarnation)
  end
  a, k = a + 2 + c, k + 1 + c
end
if #back > 0 then
  call_many('RPUSH', KEYS[4], back)
  redis.call('ZADD', KEYS[3], ms, ms)
  call_many('HSET', KEYS[2], where)
end
return #back
