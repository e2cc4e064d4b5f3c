-- Cancels a batch (`Batch.cancel`): its callbacks are cancelled (their dependents settle as a
-- cancelled job's do) and it is closed, so no callback runs; its members are cancelled by the
-- caller after this call, each by cancel.lua (they are counted as they end).
--
-- KEYS[1..] the workflow keys (_workflows.lua: workflow_keys) with the ready and wake keys of
--         each queue named
-- ARGV[1] batch id  ARGV[2] outcome ttl ms of the callbacks cancelled  ARGV[3..] the queue
--         names (the default one first)
-- Returns 1 cancelled, 0 it had ended, was cancelled already, or is unknown
local bid = ARGV[1]
local w = workflow_keys(0, {unpack(ARGV, 3)}, tonumber(ARGV[2]))
local h = batch_head(w, bid)
if not h or h.state == 'x' or redis.call('HEXISTS', w.batches, bid .. '|end') == 1 then
  return 0
end
h.state = 'x'
write_batch_head(w, bid, h)
local now = now_ms()
for _, id in ipairs({h.on_complete, h.on_success}) do
  if id ~= '' and redis.call('HDEL', w.deps, id) == 1 then
    end_cancelled(w, id, parse_state(redis.call('HGET', w.state, id)), now, w.ttl_ms)
    w.todo[#w.todo + 1] = {id, DEP_CANCELLED}
  end
end
end_batch_if_done(w, bid, now)
settle_todo(w, now)
wake_released(w)
return 1
