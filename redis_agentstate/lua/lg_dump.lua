-- lg_dump.lua: everything stored for a thread but its lease (the source side of copy_thread).
--   KEYS[1..9] - the thread's keys (see _lg.lua)
-- Returns {records, blobs, writes, runs}: three flat HGETALL replies and
-- the members of the thread's run index.
return {
  redis.call('HGETALL', KEYS[2]),
  redis.call('HGETALL', KEYS[4]),
  redis.call('HGETALL', KEYS[5]),
  redis.call('ZRANGE', KEYS[6], 0, -1),
}
