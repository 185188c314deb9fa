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
local tid, token, ttl, member = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

probe()
local refused = fence(token, server_now_ms())
if refused ~= '' then return {REPLY_REFUSED, refused} end
-- Into the checkpoint's index entry when it is stored there and KEYS[5] holds none of its writes.
local record, entry = record_of(member)
local inline = entry and not redis.call('HGET', KEYS[5], member)
local packed
if inline then
  local reads_end, held = parts_of(record)
  if not reads_end then return corrupt(3, 'checkpoint') end
  packed = held or ''
else
  packed = redis.call('HGET', KEYS[5], member) or ''
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
for _, w in ipairs(stored) do
  local f = shared_of(w)
  if f and shared[f] then redis.call('HSET', KEYS[4], f, shared[f]) end
end
if inline then
  put_record(member, with_writes(record, pack_writes(entries)), entry)
else
  redis.call('HSET', KEYS[5], member, pack_writes(entries))
end
redis.call('ZADD', KEYS[8], 0, tid)
touch(ttl)
return {REPLY_DONE}
