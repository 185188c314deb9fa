-- lgs_put.lua: put and delete items of one LangGraph store namespace (a batch's PutOps of it).
--   KEYS[1..12] - the namespace's keys and its shard's indexes (see _lgs.lua)
--   ARGV[1]    - nonce of this call: an item it wrote already is left as it is (a re-send)
--   ARGV[2]    - version: the index version the client chose the groups' lists with
--   ARGV[3..]  - groups of five: key, value JSON ('' = delete the key), ttl ms ('' = none),
--                packed vectors ('' = none), lists (comma-separated, one per vector: the list of
--                version ARGV[2] each vector goes in; '' when it has none)
-- Returns {written, pruned, listed, ended, vectors, version, trained, moving}: items put or
-- deleted now, expired items dropped, the generation of the namespace's listing while it has an
-- item ('' when it has none), and the generation of the listing this call ended, or that ended
-- in the last ENDED_MS while it has none ('' when none did: a re-sent call that ended it answers
-- as the first); then, for the client's upkeep of the vector index: how many items have vectors,
-- the index version, the vector count it was trained at ('' for none), and '' when no re-train
-- is moving items, '1' while its mover holds it, '0' once its lease lapsed. The caller lists the
-- path with the third (and unlists it with the fourth) in the shard of each proper prefix of the
-- path (lgs_index.lua). No groups: a sweep of the namespace (drops up to PRUNE expired items).
-- Returns {INDEX_MOVED, version} and writes nothing when a group has lists and ARGV[2] is not the index
-- version (a re-train since the client read it: it chooses the lists again and re-sends).
-- A call that writes an item, or drops an expired one, changes the namespace's write version (_lgs.lua).
-- Corrupt reply 1 when an item to update does not start with the header we write; 12 when the
-- write version is not one we wrote (before anything is written).
local ENDED_MS = 600000
local nonce = ARGV[1]
local version = tonumber(ARGV[2])

local current = index_version()
for i = 3, #ARGV, 5 do
  if ARGV[i + 4] ~= '' and version ~= current then return { REPLY_INDEX_MOVED, current } end
end

local written_at = write_version()
if not written_at then return corrupt(12, 'version') end

local now = server_now_ms()
local pruned = prune_expired(now)
-- Moved before the first write of the call (one stopped by a damaged item has written those before
-- it), and not by a re-send that writes nothing.
local moved = false
local function moving()
  if not moved then bump_write_version(written_at, now) end
  moved = true
end
if pruned > 0 then moving() end
local written = 0
for i = 3, #ARGV, 5 do
  local key, value, ttl, vectors, lists = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4]
  local old = redis.call('HGET', KEYS[1], key)
  if old and item_expired(key, now) then
    moving()
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
      moving()
      drop_item(key)
      written = written + 1
    end
  elseif not (old and old_nonce == nonce) then
    moving()
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
      unassign(key)
    else
      redis.call('HSET', KEYS[4], key, vectors)
      assign(key, current, lists)
    end
    written = written + 1
  end
end
reindex_namespace()
local path = store_path()
local listed = redis.call('ZSCORE', KEYS[7], path)
local ended = ''
if redis.call('ZCARD', KEYS[2]) > 0 then
  if not listed then
    listed = fmt(redis.call('INCR', KEYS[8]))
    redis.call('ZADD', KEYS[7], listed, path)
  end
elseif listed then
  redis.call('ZREM', KEYS[7], path)
  redis.call('SET', KEYS[9], listed, 'PX', ENDED_MS)
  ended, listed = listed, ''
else
  listed, ended = '', redis.call('GET', KEYS[9]) or ''
end
local index = redis.call('HMGET', KEYS[12], 'n', 'pv', 'lease')
local moving = ''
if index[2] then
  moving = '0'
  if tonumber(index[3] or '0') > now then moving = '1' end
end
return { written, pruned, listed, ended, redis.call('HLEN', KEYS[4]), current, index[1] or '', moving }
