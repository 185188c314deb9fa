-- lg_put_writes.lua: store the pending writes of one task against one checkpoint.
--   KEYS[1..10] - the thread's keys (see _lg.lua)
--   ARGV[1]     - thread id
--   ARGV[2]     - lease token of the writer ('' = it holds no lease)
--   ARGV[3]     - ttl in ms for every data key of the thread ('' = none)
--   ARGV[4..]   - triples: member <ns>\0<cid>\0<task_id>\0<idx>, '1' to replace an
--                 existing write ('0' keeps the first: a resent write is a no-op), write
-- Returns {1} stored; {0, 'busy'} / {0, 'lost'} refused by the lease (nothing written).
local tid, token, ttl = ARGV[1], ARGV[2], ARGV[3]

probe()
local refused = fence(token, now_ms())
if refused ~= '' then return {0, refused} end
for i = 4, #ARGV, 3 do
  if ARGV[i + 1] == '1' then
    redis.call('HSET', KEYS[5], ARGV[i], ARGV[i + 2])
  else
    redis.call('HSETNX', KEYS[5], ARGV[i], ARGV[i + 2])
  end
  redis.call('ZADD', KEYS[6], 0, ARGV[i])
end
redis.call('ZADD', KEYS[9], 0, tid)
touch(ttl)
return {1}
