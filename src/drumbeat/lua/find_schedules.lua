-- Finds the schedules whose id matches a pattern in a run of wheel buckets, a page at a time
-- (the dashboard's search by id prefix): HSCAN ... MATCH filters in Redis, so only matches come
-- back, and the call stops as soon as the page is full. One call covers a few thousand buckets,
-- so other clients wait little between two calls.
--
-- KEYS[i] schedules:<bucket> (hash), consecutive buckets of one shard
-- ARGV[1] MATCH pattern (the prefix, glob-escaped, then *)
-- ARGV[2] matches of KEYS[1] to skip (a previous page ended inside that bucket)
-- ARGV[3] most matches to return
-- Returns {i, seen, examined, id, record, id, record, ...}: the page filled at KEYS[i], after
--         `seen` matches of it (skipped ones included); i = 0 when every bucket was read.
--         `examined`: the schedules in the buckets read (what the walk cost)
local pattern, skip, limit = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local out = {0, 0, 0}
local found = 0
for i = 1, #KEYS do
  out[3] = out[3] + redis.call('HLEN', KEYS[i])
  local cursor, seen = '0', 0
  repeat
    local reply = redis.call('HSCAN', KEYS[i], cursor, 'MATCH', pattern, 'COUNT', '1000')
    cursor = reply[1]
    local entries = reply[2]
    for j = 1, #entries, 2 do
      seen = seen + 1
      if i > 1 or seen > skip then
        out[#out + 1] = entries[j]
        out[#out + 1] = entries[j + 1]
        found = found + 1
        if found >= limit then
          out[1], out[2] = i, seen
          return out
        end
      end
    end
  until cursor == '0'
end
return out
