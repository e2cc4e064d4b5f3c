-- Closes an open batch (`Batch.close`): it ends once nothing of it is left, at once if nothing
-- is (its callbacks are then released in this call).
--
-- KEYS[1..] the workflow keys (_workflows.lua: workflow_keys) with the ready and wake keys of
--         each queue named
-- ARGV[1] batch id  ARGV[2] outcome ttl ms (an on_success cancelled)  ARGV[3..] the queue
--         names (the default one first)
-- Returns 1 closed here, 0 closed already, cancelled or unknown
local bid = ARGV[1]
local w = workflow_keys(0, {unpack(ARGV, 3)}, tonumber(ARGV[2]))
local h = batch_head(w, bid)
if not h or h.state ~= 'o' then return 0 end
h.state = 'c'
write_batch_head(w, bid, h)
local now = now_ms()
end_batch_if_done(w, bid, now)
settle_todo(w, now)
wake_released(w)
return 1
