-- lg_delete_runs.lua: delete the checkpoints (and their writes) that runs wrote on one thread.
--   KEYS[1..9] - the thread's keys (see _lg.lua)
--   ARGV[1]     - thread id
--   ARGV[2]     - lease token of the caller ('' = it holds no lease)
--   ARGV[3..]   - run ids
-- Blobs no remaining checkpoint reads go too, and shared values no remaining blob or write references.
-- Everything it reads is checked before its first write.
-- Returns {DONE, checkpoints deleted}; {REFUSED, 'busy'} / {REFUSED, 'lost'} refused by the lease;
-- an AGENTSTATE_CORRUPT error reply for a malformed checkpoint, blob, pending writes or run member
-- (nothing written).
local tid, token = ARGV[1], ARGV[2]

probe()
local refused = fence(token, server_now_ms())
if refused ~= '' then return {REPLY_REFUSED, refused} end
if not index_runs() then return corrupt(6, 'run-member') end
local runs, gone = {}, {}
for i = 3, #ARGV do
  local run = ARGV[i]
  runs[run] = true
  local lo, hi = range_of(run)
  for _, m in ipairs(redis.call('ZRANGEBYLEX', KEYS[6], lo, hi)) do gone[#gone + 1] = m end
end
local blobs
if #gone > 0 then
  local reads, bad = all_reads()
  if not reads then return corrupt(bad, 'checkpoint') end
  local dropped = {}
  for _, m in ipairs(gone) do
    dropped[string.sub(m, #run_of(m) + 2)] = true
    reads[string.sub(m, #run_of(m) + 2)] = nil
  end
  blobs = blobs_read(reads)
  if not blobs then return corrupt(4, 'blob') end
  local writes = redis.call('HGETALL', KEYS[5])
  for i = 1, #writes, 2 do
    if not dropped[writes[i]] and not mark_writes(writes[i + 1], blobs) then return corrupt(5, 'pending-writes') end
  end
  for _, e in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
    local m, stored = split_entry(e)
    if stored and not dropped[m] then
      local reads_end, held = parts_of(stored)
      if not reads_end or (held and not mark_writes(held, blobs)) then return corrupt(3, 'pending-writes') end
    end
  end
end
-- Every check passed: the first write.
for _, m in ipairs(gone) do
  drop_checkpoint(string.sub(m, #run_of(m) + 2))
  redis.call('ZREM', KEYS[6], m)
end
gc_runs(tid, runs)
if redis.call('ZCARD', KEYS[3]) == 0 then
  drop_thread(tid)
elseif blobs then
  gc_blobs(blobs)
end
return {REPLY_DONE, #gone}
