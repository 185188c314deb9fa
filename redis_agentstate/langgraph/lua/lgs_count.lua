-- lgs_count.lua: how many live items one LangGraph store namespace holds, and the state of its
-- vector index (read-only): what a semantic search reads to choose between exact and approximate.
--   KEYS[1..12] - the namespace's keys and its shard's indexes (see _lgs.lua)
-- Returns {live, version, moving_from}: the items whose TTL has not passed on the server clock,
-- the index version (0: none trained) and the version a re-train is moving items from ('' when
-- none is).
local now = server_now_ms()
local live = redis.call('ZCARD', KEYS[2]) - redis.call('ZCOUNT', KEYS[3], '-inf', '(' .. fmt(now))
local index = redis.call('HMGET', KEYS[12], 'v', 'pv')
return { live, tonumber(index[1] or '0'), index[2] or '' }
