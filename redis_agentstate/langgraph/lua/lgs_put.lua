-- lgs_put.lua: put and delete items of one LangGraph store namespace (a batch's PutOps of it).
--   KEYS[1..9] - the namespace's keys and its shard's indexes (see _lgs.lua)
--   ARGV[1]    - nonce of this call: an item it wrote already is left as it is (a re-send)
--   ARGV[2..]  - groups of four: key, value JSON ('' = delete the key), ttl ms ('' = none),
--                packed vectors ('' = none)
-- Returns {written, pruned, listed, ended}: items put or deleted now, expired items dropped,
-- the generation of the namespace's listing while it has an item ('' when it has none), and
-- the generation of the listing this call ended, or that ended in the last ENDED_MS while it has
-- none ('' when none did: a re-sent call that ended it answers as the first). The caller lists the path
-- with the first (and unlists it with the second) in the shard of each proper prefix of the
-- path (lgs_index.lua). No groups: a sweep of the namespace (drops up to PRUNE expired items).
-- Corrupt reply 1 when an item to update does not start with the header we write.
local ENDED_MS = 600000
local nonce = ARGV[1]

local now = server_now_ms()
local pruned = prune_expired(now)
local written = 0
for i = 2, #ARGV, 4 do
  local key, value, ttl, vectors = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local old = redis.call('HGET', KEYS[1], key)
  if old and item_expired(key, now) then
    drop_item(key) -- past its TTL: a put makes a new item (new created_at, last in order)
    old = false
  end
  local created, old_nonce
  local updated = now
  if old then
    local header = { item_header(old) }
    if #header == 0 then return corrupt(1, 'item') end
    created, old_nonce = header[1], header[4]
    -- An update within the millisecond of the last one still moves updated_at on.
    updated = math.max(now, tonumber(header[2]) + 1)
  end
  if value == '' then
    if old then
      drop_item(key)
      written = written + 1
    end
  elseif not (old and old_nonce == nonce) then
    if not old then
      local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
      local seq = 1
      if #last > 0 then seq = tonumber(last[2]) + 1 end
      redis.call('ZADD', KEYS[2], seq, key)
      created = fmt(now)
    end
    redis.call('HSET', KEYS[1], key, created .. ':' .. fmt(updated) .. ':' .. ttl .. ':' .. nonce .. ':' .. value)
    if ttl == '' then
      redis.call('ZREM', KEYS[3], key)
    else
      redis.call('ZADD', KEYS[3], now + tonumber(ttl), key)
    end
    if vectors == '' then
      redis.call('HDEL', KEYS[4], key)
    else
      redis.call('HSET', KEYS[4], key, vectors)
    end
    written = written + 1
  end
end
reindex_namespace()
local path = store_path()
local listed = redis.call('ZSCORE', KEYS[7], path)
if redis.call('ZCARD', KEYS[2]) > 0 then
  if not listed then
    listed = fmt(redis.call('INCR', KEYS[8]))
    redis.call('ZADD', KEYS[7], listed, path)
  end
  return { written, pruned, listed, '' }
end
if listed then
  redis.call('ZREM', KEYS[7], path)
  redis.call('SET', KEYS[9], listed, 'PX', ENDED_MS)
  return { written, pruned, '', listed }
end
return { written, pruned, '', redis.call('GET', KEYS[9]) or '' }
