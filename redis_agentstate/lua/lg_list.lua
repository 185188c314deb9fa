-- lg_list.lua: one page of a thread's checkpoints, newest first.
--   KEYS[1..9] - the thread's keys (see _lg.lua)
--   ARGV[1]    - upper bound, a ZREVRANGEBYLEX max ('+', '(<member>', ...)
--   ARGV[2]    - lower bound, a ZREVRANGEBYLEX min
--   ARGV[3]    - page size
--   ARGV[4]    - '1': whole checkpoints (a listing without a metadata filter reads every one);
--                '0': records only (the caller filters on metadata, then reads the matches)
--   ARGV[5]    - thread id
-- A thread without checkpoints (expired with the saver's ttl) is dropped from the shard's
-- thread and run indexes when a listing meets it (housekeeping the next listing would redo).
-- Returns {members, records} for '0'; {members, checkpoints} for '1', each checkpoint
-- as lg_get returns it (see checkpoint_reply in _lg.lua); an AGENTSTATE_CORRUPT error reply
-- for a malformed checkpoint or blob.
local members = redis.call('ZREVRANGEBYLEX', KEYS[3], ARGV[1], ARGV[2], 'LIMIT', 0, tonumber(ARGV[3]))
if #members == 0 then
  if redis.call('ZCARD', KEYS[3]) == 0 and redis.call('ZSCORE', KEYS[8], ARGV[5]) then forget_thread(ARGV[5]) end
  return {{}, {}}
end
if ARGV[4] ~= '1' then return {members, redis.call('HMGET', KEYS[2], unpack(members))} end
local out = {}
for i, m in ipairs(members) do
  local reply, k, what = checkpoint_reply(m)
  if reply == CORRUPT then return corrupt(k, what) end
  out[i] = reply or false
end
return {members, out}
