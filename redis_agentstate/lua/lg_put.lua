-- lg_put.lua: store one checkpoint of a thread and the channel values it changed.
--   KEYS[1..9] - the thread's keys (see _lg.lua)
--   ARGV[1]     - thread id
--   ARGV[2]     - lease token of the writer ('' = it holds no lease)
--   ARGV[3]     - ttl in ms for every data key of the thread ('' = none)
--   ARGV[4]     - <ns>\0<cid>
--   ARGV[5]     - the stored checkpoint: '<n>:' + the blob fields it reads (n bytes) + record
--   ARGV[6]     - run id ('' = none)
--   ARGV[7]     - <ns>\0<parent cid> ('' = no parent)
--   ARGV[8..]   - blob field, value pairs: the channels of new_versions only, and the shared
--                 values their references name ('\0\0' + digest, 'F' + value; see _lg.lua)
-- Returns {DONE} stored; {REFUSED, 'busy'} / {REFUSED, 'lost'} refused by the lease (nothing
-- written); {REFUSED, 'gone', parent} the parent is not in the thread (deleted under the
-- writer: storing the child would resurrect a thread whose channels read back missing;
-- nothing written); {REFUSED, 'base', field} a tail whose base is gone (nothing written:
-- the caller resends the full value).
local tid, token, ttl, member, record, run_id = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local parent = ARGV[7]

probe()
local refused = fence(token, server_now_ms())
if refused ~= '' then return {REPLY_REFUSED, refused} end
if parent ~= '' and redis.call('HEXISTS', KEYS[2], parent) == 0 then return {REPLY_REFUSED, 'gone', parent} end
for i = 8, #ARGV, 2 do
  local base = base_of(ARGV[i], ARGV[i + 1])
  if base and redis.call('HEXISTS', KEYS[4], base) == 0 then return {REPLY_REFUSED, 'base', ARGV[i]} end
end
redis.call('HSET', KEYS[2], member, record)
redis.call('ZADD', KEYS[3], 0, member)
for i = 8, #ARGV, 2 do
  redis.call('HSET', KEYS[4], ARGV[i], ARGV[i + 1])
end
redis.call('ZADD', KEYS[8], 0, tid)
if run_id ~= '' then
  redis.call('ZADD', KEYS[6], 0, run_id .. SEP .. member)
  redis.call('ZADD', KEYS[9], 0, run_id .. SEP .. tid)
end
touch(ttl)
return {REPLY_DONE}
