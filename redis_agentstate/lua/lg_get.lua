-- lg_get.lua: one checkpoint of a thread with its channel values and pending writes.
--   KEYS[1..9] - the thread's keys (see _lg.lua)
--   ARGV[1]     - checkpoint namespace
--   ARGV[2]     - checkpoint id ('' = the newest of the namespace)
--   ARGV[3]     - ttl in ms to refresh on every data key of the thread ('' = leave it)
-- Returns {} if there is no such checkpoint, else {member, record, blobs, writes}:
-- blobs = {field, {value, base value, ...}, ...} (each tail chain newest first),
-- writes = the checkpoint's packed pending writes ('' if none; see _lg.lua).
local ns, cid, ttl = ARGV[1], ARGV[2], ARGV[3]

local member
if cid == '' then
  member = redis.call('ZREVRANGEBYLEX', KEYS[3], '(' .. ns .. '\1', '[' .. ns .. SEP, 'LIMIT', 0, 1)[1]
  if not member then return {} end
else
  member = ns .. SEP .. cid
end
local record = redis.call('HGET', KEYS[2], member)
if not record then return {} end
local blobs = {}
for _, f in ipairs(split_fields(reads_of(record))) do
  blobs[#blobs + 1] = f
  blobs[#blobs + 1] = chain(f)
end
local writes = redis.call('HGET', KEYS[5], member) or ''
touch(ttl)
return {member, record, blobs, writes}
