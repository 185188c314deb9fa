-- pool_join.lua: add (or replace) a member and append member_joined.
-- A join of exactly the member already joined (same run id, same bytes)
-- changes nothing: it is the same write re-sent (by the library after a lost
-- reply or by the caller after BackendUnavailable) and gets that join's
-- cursor. Another member under the same run id replaces it and appends.
--   KEYS[1..10] - the pool's keys (see _pool.lua)
--   ARGV[1]     - max records to keep in the log (0 = all)
--   ARGV[2]     - run id of the member
--   ARGV[3]     - member blob (also the record's payload)
-- Returns {POOL_NOT_OPEN}; {POOL_DONE, seq} joined; {POOL_DONE_BEFORE, seq} this
-- member was joined already.
local maxlen, run_id, member = tonumber(ARGV[1]), ARGV[2], ARGV[3]

if not is_open() then return { POOL_NOT_OPEN } end
if redis.call('HGET', KEYS[2], run_id) == member then
  local joined = redis.call('HGET', KEYS[9], run_id)
  if joined and not string.find(joined, ':', 1, true) then return { POOL_DONE_BEFORE, joined } end
end
redis.call('HSET', KEYS[2], run_id, member)
local seq = append('member_joined', member, maxlen)
redis.call('HSET', KEYS[9], run_id, fmt(seq))
redis.call('ZREM', KEYS[10], run_id)
return { POOL_DONE, seq }
