-- pool_leave.lua: remove a member and append member_left with its last state.
--   KEYS[1..8] - the pool's keys (see _pool.lua)
--   KEYS[9]    - nonce key of this call
--   ARGV[1]    - max records to keep in the log (0 = all)
--   ARGV[2]    - ms to remember this call's reply (for a re-send after a lost reply)
--   ARGV[3]    - run id of the member
-- Returns {-1} never opened; {-2} not a member; {1, seq, member blob} left;
-- {2, seq, member blob} this nonce left already (so a re-send is not NotAMember).
local maxlen, remember_ms, run_id = tonumber(ARGV[1]), ARGV[2], ARGV[3]

local seen = remembered()
if seen then
  local seq, member = split_seq(seen)
  return { 2, seq, member }
end
if not is_open() then return { -1 } end
local member = redis.call('HGET', KEYS[2], run_id)
if not member then return { -2 } end
redis.call('HDEL', KEYS[2], run_id)
local seq = append('member_left', member, maxlen)
remember(fmt(seq) .. ':' .. member, remember_ms)
return { 1, seq, member }
