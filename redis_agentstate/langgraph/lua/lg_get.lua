-- lg_get.lua: one checkpoint of a thread with its channel values and pending writes.
--   KEYS[1..9] - the thread's keys (see _lg.lua)
--   ARGV[1]    - checkpoint namespace
--   ARGV[2]    - checkpoint id ('' = the newest of the namespace)
--   ARGV[3]    - ttl in ms to refresh on every data key of the thread ('' = leave it)
-- Returns {} if there is no such checkpoint, else {member, record, blobs, writes}
-- (see checkpoint_reply in _lg.lua); an AGENTSTATE_CORRUPT error reply for a malformed
-- checkpoint or blob.
local ns, cid, ttl = ARGV[1], ARGV[2], ARGV[3]

local member, stored
if cid == '' then
  local entry = redis.call('ZREVRANGEBYLEX', KEYS[3], '(' .. ns .. '\1', '[' .. ns .. SEP, 'LIMIT', 0, 1)[1]
  if not entry then return {} end
  member, stored = split_entry(entry)
else
  member = ns .. SEP .. cid
end
local reply, i, what = checkpoint_reply(member, nil, nil, stored)
if not reply then return {} end
if reply == CORRUPT then return corrupt(i, what) end
touch(ttl)
return reply
