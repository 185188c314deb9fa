-- lg_delete_runs.lua: delete the checkpoints (and their writes) that runs wrote on one thread.
--   KEYS[1..9] - the thread's keys (see _lg.lua)
--   ARGV[1]     - thread id
--   ARGV[2]     - lease token of the caller ('' = it holds no lease)
--   ARGV[3..]   - run ids
-- Blobs no remaining checkpoint reads go too.
-- Returns {DONE, checkpoints deleted}; {REFUSED, 'busy'} / {REFUSED, 'lost'} refused by the lease.
local tid, token = ARGV[1], ARGV[2]

probe()
local refused = fence(token, server_now_ms())
if refused ~= '' then return {REPLY_REFUSED, refused} end
local dropped, runs = 0, {}
for i = 3, #ARGV do
  local run = ARGV[i]
  runs[run] = true
  local lo, hi = range_of(run)
  for _, m in ipairs(redis.call('ZRANGEBYLEX', KEYS[6], lo, hi)) do
    drop_checkpoint(string.sub(m, #run + 2))
    redis.call('ZREM', KEYS[6], m)
    dropped = dropped + 1
  end
end
gc_runs(tid, runs)
if redis.call('ZCARD', KEYS[3]) == 0 then
  drop_thread(tid)
elseif dropped > 0 then
  gc_blobs()
end
return {REPLY_DONE, dropped}
