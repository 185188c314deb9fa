-- lg_lease.lua: claim a thread for one writer.
--   KEYS[1..9] - the thread's keys (see _lg.lua)
--   ARGV[1]     - lease token of the claimant
--   ARGV[2]     - lease duration in ms, counted from now on the server clock
-- A thread is free when nobody holds it or its holder's lease expired (that
-- holder's later writes are then refused as 'lost'). The lease key expires with the
-- lease, so a holder that crashed leaves nothing behind.
-- Returns {DONE, expires_at_ms, now_ms} claimed; {REFUSED, holder's expires_at_ms, now_ms} busy
-- (now_ms: the server clock, which a waiter counts its wait_ms on).
local token, lease_ms = ARGV[1], tonumber(ARGV[2])

redis.call('HLEN', KEYS[1])
local now = server_now_ms()
local h = redis.call('HMGET', KEYS[1], 'holder', 'exp')
local exp = lease_exp(h[2])
if h[1] and h[1] ~= token and exp > now then return {REPLY_REFUSED, string.format('%d', exp), string.format('%d', now)} end
local expires = string.format('%d', now + lease_ms)
redis.call('HSET', KEYS[1], 'holder', token, 'exp', expires)
redis.call('PEXPIRE', KEYS[1], lease_ms)
return {REPLY_DONE, expires, string.format('%d', now)}
