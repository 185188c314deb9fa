-- lg_prune.lua: prune one thread: keep the newest checkpoint of each namespace, or delete all.
--   KEYS[1..9] - the thread's keys (see _lg.lua)
--   ARGV[1]     - thread id
--   ARGV[2]     - 'keep_latest' or 'delete'
--   ARGV[3..]   - keep_latest: members <ns>\0<cid> to keep as well (the ancestors a
--                 DeltaChannel of a kept checkpoint replays, found by the caller)
-- A thread under a live lease is left alone. keep_latest keeps the kept
-- checkpoints' writes and every blob they read (tail chains included).
-- Returns {DONE} pruned; {REFUSED, 'busy'} skipped (leased).
local tid, strategy = ARGV[1], ARGV[2]

probe()
if leased(server_now_ms()) then return {REPLY_REFUSED, 'busy'} end
if strategy == 'delete' then
  drop_thread(tid)
  return {REPLY_DONE}
end
local members = redis.call('ZRANGE', KEYS[3], 0, -1)
local keep = {}
for i = 3, #ARGV do keep[ARGV[i]] = true end
for i, m in ipairs(members) do
  local ns = string.sub(m, 1, string.find(m, SEP, 1, true) - 1)
  local nxt = members[i + 1]
  if not nxt or string.sub(nxt, 1, #ns + 1) ~= ns .. SEP then keep[m] = true end
end
for _, m in ipairs(members) do
  if not keep[m] then drop_checkpoint(m) end
end
local runs = {}
for _, m in ipairs(redis.call('ZRANGE', KEYS[6], 0, -1)) do
  local c = string.find(m, SEP, 1, true)
  if not keep[string.sub(m, c + 1)] then
    runs[string.sub(m, 1, c - 1)] = true
    redis.call('ZREM', KEYS[6], m)
  end
end
gc_runs(tid, runs)
gc_blobs()
return {REPLY_DONE}
