-- lg_release.lua: give a thread's lease up and wake one waiter.
--   KEYS[1..9] - the thread's keys (see _lg.lua)
--   ARGV[1]     - lease token
-- The notice expires after a minute so one left by nobody's wait does not pile up.
-- Returns REPLY_DONE released; REPLY_REFUSED the token did not hold it.
local token = ARGV[1]

if redis.call('HGET', KEYS[1], 'holder') ~= token then return REPLY_REFUSED end
redis.call('DEL', KEYS[1])
redis.call('DEL', KEYS[7])
redis.call('RPUSH', KEYS[7], '1')
redis.call('PEXPIRE', KEYS[7], 60000)
return REPLY_DONE
