-- pool_leave.lua: remove a member and append member_left with its last state.
-- A leave of a run that already left (and has not joined again) is that
-- leave re-sent: it gets the first leave's member and cursor, not NotAMember,
-- for the pool's last ARGV[2] leaves (older ones are forgotten, so the
-- memory is bounded; the run then is simply not a member).
--   KEYS[1..10] - the pool's keys (see _pool.lua)
--   ARGV[1]     - max records to keep in the log (0 = all)
--   ARGV[2]     - how many of the pool's latest leaves to remember (>= 1)
--   ARGV[3]     - run id of the member
-- Returns {POOL_NOT_OPEN}; {POOL_NOT_A_MEMBER}; {POOL_DONE, seq, member blob} left;
-- {POOL_DONE_BEFORE, seq, member blob} this run had left already (nothing written).
local maxlen, keep, run_id = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]

if not is_open() then return { POOL_NOT_OPEN } end
local member = redis.call('HGET', KEYS[2], run_id)
if not member then
  local last = redis.call('HGET', KEYS[9], run_id)
  if last then
    local seq, blob = split_seq(last)
    if seq then return { POOL_DONE_BEFORE, seq, blob } end
  end
  return { POOL_NOT_A_MEMBER }
end
redis.call('HDEL', KEYS[2], run_id)
local seq = append('member_left', member, maxlen)
redis.call('HSET', KEYS[9], run_id, fmt(seq) .. ':' .. member)
redis.call('ZADD', KEYS[10], seq, run_id)
if redis.call('ZCARD', KEYS[10]) > keep then
  local oldest = redis.call('ZPOPMIN', KEYS[10])
  redis.call('HDEL', KEYS[9], oldest[1])
end
return { POOL_DONE, seq, member }
