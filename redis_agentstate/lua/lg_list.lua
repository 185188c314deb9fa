-- lg_list.lua: one page of a thread's checkpoints, newest first (records only).
--   KEYS[1..9] - the thread's keys (see _lg.lua)
--   ARGV[1]     - upper bound, a ZREVRANGEBYLEX max ('+', '(<member>', ...)
--   ARGV[2]     - lower bound, a ZREVRANGEBYLEX min
--   ARGV[3]     - page size
-- Returns {members, records}.
local members = redis.call('ZREVRANGEBYLEX', KEYS[3], ARGV[1], ARGV[2], 'LIMIT', 0, tonumber(ARGV[3]))
if #members == 0 then return {{}, {}} end
return {members, redis.call('HMGET', KEYS[2], unpack(members))}
