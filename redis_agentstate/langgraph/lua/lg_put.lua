-- lg_put.lua: store one checkpoint of a thread and the channel values it changed.
--   KEYS[1..9] - the thread's keys (see _lg.lua)
--   ARGV[1]     - thread id
--   ARGV[2]     - lease token of the writer ('' = it holds no lease)
--   ARGV[3]     - ttl in ms for every data key of the thread ('' = none)
--   ARGV[4]     - <ns>\0<cid>
--   ARGV[5]     - the stored checkpoint: '<n>:' + the blob fields it reads (n bytes) + record
--                 (stored in KEYS[3], see _lg.lua)
--   ARGV[6]     - run id ('' = none)
--   ARGV[7]     - <ns>\0<parent cid> ('' = no parent)
--   ARGV[8..]   - blob field, value pairs: the channels of new_versions only, and the shared
--                 values their references name ('\0\0' + digest, 'F' + value; see _lg.lua)
-- Returns {DONE} stored; {REFUSED, 'busy'} / {REFUSED, 'lost'} refused by the lease (nothing
-- written); {REFUSED, 'gone', parent} the parent is not in the thread (deleted under the
-- writer: storing the child would resurrect a thread whose channels read back missing;
-- nothing written); {REFUSED, 'base', field} a tail whose base is gone (nothing written:
-- the caller resends the full value); an AGENTSTATE_CORRUPT error reply if the checkpoint
-- stored under the same id is malformed (nothing written).
-- A key of another Redis type fails with WRONGTYPE before the first write: each key it writes is
-- read before (KEYS[1], [3], [5]; [2] when the checkpoint is not in the index), is the first
-- write (KEYS[8]), or is probed (KEYS[2] otherwise, [4], [6], [9]); KEYS[7] it never touches.
local tid, token, ttl, member, record, run_id = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local parent = ARGV[7]

local refused = fence(token, server_now_ms())
if refused ~= '' then return {REPLY_REFUSED, refused} end
-- The parent's index entry counted, not read: its stored checkpoint is not copied into the script.
if parent ~= '' and redis.call('ZLEXCOUNT', KEYS[3], '[' .. parent .. SEP, '(' .. parent .. '\1') == 0
    and redis.call('HEXISTS', KEYS[2], parent) == 0 then
  return {REPLY_REFUSED, 'gone', parent}
end
-- The checkpoint holds its pending writes: those it held if it is stored again, or those sent
-- before it (LangGraph's background writer can run a task's put_writes before the put), which
-- leave KEYS[5] (unpacked first: they are checked before the first write).
local old_stored, old_entry = record_of(member)
local held
if old_entry then
  local reads_end, w = parts_of(old_stored)
  if not reads_end then return corrupt(3, 'checkpoint') end
  held = w
end
local early = redis.call('HGET', KEYS[5], member)
if early then
  if not unpack_writes(early) then return corrupt(5, 'pending-writes') end
  held = early
end
local stored = with_writes(record, held)
if not stored then return redis.error_reply('ERR lg_put: ARGV[5] is not a framed checkpoint') end
local blobs_read = false
for i = 8, #ARGV, 2 do
  local base = base_of(ARGV[i], ARGV[i + 1])
  if base then
    if redis.call('HEXISTS', KEYS[4], base) == 0 then return {REPLY_REFUSED, 'base', ARGV[i]} end
    blobs_read = true
  end
end
if #ARGV >= 8 and not blobs_read then redis.call('HLEN', KEYS[4]) end
if old_entry then redis.call('HLEN', KEYS[2]) end
if run_id ~= '' then
  redis.call('ZCARD', KEYS[6])
  redis.call('ZCARD', KEYS[9])
end
redis.call('ZADD', KEYS[8], 0, tid)
-- Without an index entry, record_of read KEYS[2]: the record is in neither layout (nothing to drop).
put_record(member, stored, old_entry, not old_entry and not old_stored)
if early then redis.call('HDEL', KEYS[5], member) end
for i = 8, #ARGV, 2 do
  redis.call('HSET', KEYS[4], ARGV[i], ARGV[i + 1])
end
if run_id ~= '' then
  redis.call('ZADD', KEYS[6], 0, run_id .. SEP .. member)
  redis.call('ZADD', KEYS[9], 0, run_id .. SEP .. tid)
end
touch(ttl)
return {REPLY_DONE}
