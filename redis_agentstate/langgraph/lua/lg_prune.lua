-- lg_prune.lua: prune one thread: keep the newest checkpoint of each namespace, or delete all.
--   KEYS[1..9] - the thread's keys (see _lg.lua)
--   ARGV[1]     - thread id
--   ARGV[2]     - 'keep_latest' or 'delete'
--   ARGV[3..]   - keep_latest: members <ns>\0<cid> to keep as well (the ancestors a
--                 DeltaChannel of a kept checkpoint replays, found by the caller)
-- A thread under a live lease is left alone. keep_latest keeps the kept
-- checkpoints' writes and every blob they read (tail chains included), and the shared
-- values those blobs and writes reference.
-- Everything it reads is checked before its first write.
-- Returns {DONE} pruned; {REFUSED, 'busy'} skipped (leased); an AGENTSTATE_CORRUPT error
-- reply for a malformed checkpoint, blob, pending writes, index or run member (nothing written).
local tid, strategy = ARGV[1], ARGV[2]

probe()
if leased(server_now_ms()) then return {REPLY_REFUSED, 'busy'} end
if strategy == 'delete' then
  if not drop_thread(tid) then return corrupt(6, 'run-member') end
  return {REPLY_DONE}
end
local members = members_of(redis.call('ZRANGE', KEYS[3], 0, -1))
local keep = {}
for i = 3, #ARGV do keep[ARGV[i]] = true end
for i, m in ipairs(members) do
  local c = string.find(m, SEP, 1, true)
  if not c then return corrupt(3, 'member') end
  local ns = string.sub(m, 1, c - 1)
  local nxt = members[i + 1]
  if not nxt or string.sub(nxt, 1, #ns + 1) ~= ns .. SEP then keep[m] = true end
end
local reads, bad = all_reads()
if not reads then return corrupt(bad, 'checkpoint') end
for m in pairs(reads) do
  if not keep[m] then reads[m] = nil end
end
local blobs = blobs_read(reads)
if not blobs then return corrupt(4, 'blob') end
for m in pairs(keep) do
  local stored, entry = record_of(m)
  local w = writes_of(m, entry and stored)
  if not w or not mark_writes(w, blobs) then return corrupt(5, 'pending-writes') end
end
local runs, gone = {}, {}
for _, m in ipairs(redis.call('ZRANGE', KEYS[6], 0, -1)) do
  local run = run_of(m)
  if not run then return corrupt(6, 'run-member') end
  if not keep[string.sub(m, #run + 2)] then
    runs[run] = true
    gone[#gone + 1] = m
  end
end
-- Every check passed: the first write.
for _, m in ipairs(members) do
  if not keep[m] then drop_checkpoint(m) end
end
for _, m in ipairs(gone) do redis.call('ZREM', KEYS[6], m) end
gc_runs(tid, runs)
gc_blobs(blobs)
return {REPLY_DONE}
