-- lg_dump.lua: everything stored for a thread but its lease (the source side of copy_thread).
--   KEYS[1..9] - the thread's keys (see _lg.lua)
-- Returns {records, blobs, writes, runs, where}: the thread's stored checkpoints (both layouts: see
-- _lg.lua) as member, stored pairs, two flat HGETALL replies, the members of its run index, and
-- the KEYS index each stored checkpoint was read from (3, or 2: the layout of earlier versions).
local records, at = {}, {}
local stored_in, where = all_records()
for m, stored in pairs(stored_in) do
  records[#records + 1] = m
  records[#records + 1] = stored
  at[#at + 1] = where[m]
end
return {
  records,
  redis.call('HGETALL', KEYS[4]),
  redis.call('HGETALL', KEYS[5]),
  redis.call('ZRANGE', KEYS[6], 0, -1),
  at,
}
