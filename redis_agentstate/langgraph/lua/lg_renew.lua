-- lg_renew.lua: extend a live lease on a thread.
--   KEYS[1..9] - the thread's keys (see _lg.lua)
--   ARGV[1]     - lease token
--   ARGV[2]     - new lease duration in ms, counted from now on the server clock
-- An expired lease is not revived (another writer may be about to claim). The lease key
-- expires with the lease (see lg_lease.lua).
-- Returns {DONE, expires_at_ms} renewed; {REFUSED} not renewed.
local token, lease_ms = ARGV[1], tonumber(ARGV[2])

local now = server_now_ms()
local h = redis.call('HMGET', KEYS[1], 'holder', 'exp')
if h[1] ~= token or lease_exp(h[2]) <= now then return {REPLY_REFUSED} end
local expires = string.format('%d', now + lease_ms)
redis.call('HSET', KEYS[1], 'exp', expires)
redis.call('PEXPIRE', KEYS[1], lease_ms)
return {REPLY_DONE, expires}
