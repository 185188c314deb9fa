-- lg_release.lua: give a thread's lease up and wake one waiter.
--   KEYS[1..9] - the thread's keys (see _lg.lua)
--   ARGV[1]     - lease token
-- The notice expires after a minute so one left by nobody's wait does not pile up. The
-- released token stays in KEYS[1] ('released', no holder: the thread is free) for as long, so
-- that a re-send after a lost reply answers as the release did (a lease taken since keeps it,
-- until its own release replaces it).
-- Returns REPLY_DONE released (now, or by this very token before); REPLY_REFUSED the token did
-- not hold it.
local token = ARGV[1]

local h = redis.call('HMGET', KEYS[1], 'holder', 'released')
if h[1] ~= token then
  if h[2] == token then return REPLY_DONE end
  return REPLY_REFUSED
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'released', token)
redis.call('PEXPIRE', KEYS[1], 60000)
redis.call('DEL', KEYS[7])
redis.call('RPUSH', KEYS[7], '1')
redis.call('PEXPIRE', KEYS[7], 60000)
return REPLY_DONE
