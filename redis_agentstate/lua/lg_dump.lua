-- lg_dump.lua: everything stored for a thread but its lease (the source side of copy_thread).
--   KEYS[1..11] - the thread's keys (see _lg.lua)
-- Returns {records, versions, blobs, writes, runs}: four flat HGETALL replies and
-- the members of the thread's run index.
return {
  redis.call('HGETALL', KEYS[2]),
  redis.call('HGETALL', KEYS[4]),
  redis.call('HGETALL', KEYS[5]),
  redis.call('HGETALL', KEYS[6]),
  redis.call('ZRANGE', KEYS[8], 0, -1),
}
