-- lg_put_writes.lua: store the pending writes of one task against one checkpoint.
--   KEYS[1..9] - the thread's keys (see _lg.lua)
--   ARGV[1]     - thread id
--   ARGV[2]     - lease token of the writer ('' = it holds no lease)
--   ARGV[3]     - ttl in ms for every data key of the thread ('' = none)
--   ARGV[4]     - <ns>\0<cid>
--   ARGV[5]     - n: how many ARGV entries of shared values follow
--   ARGV[6..]   - n entries: field, value pairs of shared values ('\0\0' + digest; see _lg.lua),
--                 each stored if a write this call stores references it; then triples:
--                 <task_id>\0<idx>, '1' to replace an existing write ('0' keeps the first: a
--                 resent write is a no-op), write ('R' + digest + ...: a reference)
-- Returns {DONE} stored; {REFUSED, 'busy'} / {REFUSED, 'lost'} refused by the lease (nothing written);
-- an AGENTSTATE_CORRUPT error reply if the checkpoint's stored writes are malformed (nothing written).
-- A key of another Redis type fails with WRONGTYPE before the first write: each key it writes is
-- read before (KEYS[1], [3], [5]; [2] when the checkpoint is not in the index), is the first
-- write (KEYS[8]), or is probed (KEYS[2] otherwise, [4] when a shared value is stored).
local tid, token, ttl, member = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

local refused = fence(token, server_now_ms())
if refused ~= '' then return {REPLY_REFUSED, refused} end
-- Into the checkpoint's index entry when it is stored there and KEYS[5] holds none of its writes.
local record, entry = record_of(member)
local early = redis.call('HGET', KEYS[5], member)
local inline = entry and not early
local packed
if inline then
  local reads_end, held = parts_of(record)
  if not reads_end then return corrupt(3, 'checkpoint') end
  packed = held or ''
else
  packed = early or ''
end
local entries = unpack_writes(packed)
if not entries then return corrupt(inline and 3 or 5, 'pending-writes') end
local n_shared = tonumber(ARGV[5])
local shared = {}
for i = 6, 5 + n_shared, 2 do shared[ARGV[i]] = ARGV[i + 1] end
local at, stored = {}, {}
for j, e in ipairs(entries) do at[e[1]] = j end
for i = 6 + n_shared, #ARGV, 3 do
  local j = at[ARGV[i]]
  if not j then
    entries[#entries + 1] = {ARGV[i], ARGV[i + 2]}
    at[ARGV[i]] = #entries
    stored[#stored + 1] = ARGV[i + 2]
  elseif ARGV[i + 1] == '1' then
    entries[j][2] = ARGV[i + 2]
    stored[#stored + 1] = ARGV[i + 2]
  end
end
local new_shared = {}
for _, w in ipairs(stored) do
  local f = shared_of(w)
  if f and shared[f] then new_shared[#new_shared + 1] = f end
end
if #new_shared > 0 then redis.call('HLEN', KEYS[4]) end
if inline then redis.call('HLEN', KEYS[2]) end
redis.call('ZADD', KEYS[8], 0, tid)
for _, f in ipairs(new_shared) do redis.call('HSET', KEYS[4], f, shared[f]) end
if inline then
  put_record(member, with_writes(record, pack_writes(entries)), entry)
else
  redis.call('HSET', KEYS[5], member, pack_writes(entries))
end
touch(ttl)
return {REPLY_DONE}
