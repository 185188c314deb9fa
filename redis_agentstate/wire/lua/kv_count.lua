-- kv_count.lua: the number of live keys of one shard (read-only).
--   KEYS[1..2] - the shard's kvkeys and kvttl (see _kv.lua)
-- Returns every indexed key minus those whose expiry has passed on the server clock.
local now = server_now_ms()
return redis.call('ZCARD', KEYS[1]) - redis.call('ZCOUNT', KEYS[2], '-inf', '(' .. fmt(now))
