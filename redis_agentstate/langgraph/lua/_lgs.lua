-- _lgs.lua: prelude of the LangGraph store's scripts (redis_agentstate/langgraph/_store_core.py).
--
-- Layout of one store namespace, whose path <path> is its labels joined by NUL (keys.py builds
-- these; every key of a call shares the shard tag of <path>, so one hash slot):
--   KEYS[1] - ns:{ns#SS}:lgsi:<path>  hash  key -> "<created>:<updated>:<ttl>:<nonce>:<json>"
--             (server ms; ttl in ms, '' for none; nonce: the put call that wrote it last)
--   KEYS[2] - ns:{ns#SS}:lgso:<path>  zset  key -> insertion number (search order, kept on update)
--   KEYS[3] - ns:{ns#SS}:lgsx:<path>  zset  key -> expiry in server ms (items with a TTL only)
--   KEYS[4] - ns:{ns#SS}:lgsv:<path>  hash  key -> packed vectors (opaque here)
--   KEYS[5] - ns:{ns#SS}:lgsns        zset  every path of the shard that has an item, score 0; and
--                                           every path with an item that has a proper prefix whose
--                                           path is in this shard (lgs_index.lua lists it there, so
--                                           a prefix search reads the prefix's shard alone)
--   KEYS[6] - ns:{ns#SS}:lgsnx        zset  path -> expiry of its last item to expire; a path of the
--                                           shard with an item that never expires is absent
--   KEYS[7] - ns:{ns#SS}:lgsng        zset  path -> generation of its listing (members of KEYS[5])
--   KEYS[8] - ns:{ns#SS}:gen          string the shard's epoch counter: a new listing's generation
--   KEYS[9] - ns:{ns#SS}:lgse:<path>  string the generation of the path's listing that ended last
--                                           (kept ENDED_MS, for a re-sent call that ended it)
--   KEYS[10] - ns:{ns#SS}:lgsl:<path> zset  the inverted lists of the namespace's vector index: one
--                                           member per stored vector (list_member), score version *
--                                           LIST_SPAN + list (version 0: no index yet, one list 0)
--   KEYS[11] - ns:{ns#SS}:lgsa:<path> hash  key -> how many vectors it has, where more than one
--   KEYS[12] - ns:{ns#SS}:lgsc:<path> hash  the index: v (its version, absent = 0), c:<v> (centroids:
--                                           float32, unit length), k:<v> (how many), n (vectors when
--                                           trained), pv (the version a re-train is moving items from,
--                                           while it does), by and lease (the mover: token, server ms)
--                                           and w: the namespace's write version, changed by every
--                                           call that puts, deletes or drops one of its items (what a
--                                           client's cache of its vectors checks: _store_cache.py)
-- An item whose expiry passed on the server clock is never returned; writers of its namespace
-- drop up to PRUNE of them per call, lgs_put with no items is the sweep.

local PRUNE = 100
local LIST_SPAN = 65536

local function store_path()
  return id_after(KEYS[1], '}:lgsi:')
end

-- created, updated, ttl ('' for none), nonce of a stored item, or nil when it is not one we wrote.
local function item_header(blob)
  return string.match(blob, '^(%d+):(%d+):(%d*):([^:]*):')
end

-- The member of vector ``i`` of ``key`` in the inverted lists: the key itself for its first vector
-- (a key without NUL), else key .. NUL .. i (the client reads the key before the last NUL).
local function list_member(key, i)
  if i == 1 and not string.find(key, '\0', 1, true) then return key end
  return key .. '\0' .. i
end

-- The namespace's write version ('0' before its first write), or nil when it is not one we wrote.
local function write_version()
  local w = redis.call('HGET', KEYS[12], 'w')
  if not w then return '0' end
  if not string.match(w, '^%d+$') or #w > 16 then return nil end
  return w
end

-- A new write version, greater than the last; at least the server clock in ms * 1024, so a version
-- seen before the keys were lost (a flush, a deleted hash) does not come back for other contents.
local function bump_write_version(current, now)
  redis.call('HSET', KEYS[12], 'w', fmt(math.max(tonumber(current) + 1, now * 1024)))
end

-- The current version of the namespace's vector index (0: none trained).
local function index_version()
  return tonumber(redis.call('HGET', KEYS[12], 'v') or '0')
end

local function unassign(key)
  local n = tonumber(redis.call('HGET', KEYS[11], key) or '1')
  for i = 1, n do redis.call('ZREM', KEYS[10], list_member(key, i)) end
  redis.call('HDEL', KEYS[11], key)
end

-- Put ``key``'s vectors in the lists ``lists`` (comma-separated list numbers, one per vector, in
-- the order of its packed vectors) of index version ``version``.
local function assign(key, version, lists)
  unassign(key)
  local n = 0
  for list in string.gmatch(lists, '%d+') do
    n = n + 1
    redis.call('ZADD', KEYS[10], version * LIST_SPAN + tonumber(list), list_member(key, n))
  end
  if n > 1 then redis.call('HSET', KEYS[11], key, n) end
end

local function drop_item(key)
  redis.call('HDEL', KEYS[1], key)
  redis.call('ZREM', KEYS[2], key)
  redis.call('ZREM', KEYS[3], key)
  redis.call('HDEL', KEYS[4], key)
  unassign(key)
end

-- Drop up to PRUNE items whose expiry passed; returns how many.
local function prune_expired(now)
  local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', '(' .. fmt(now), 'LIMIT', 0, PRUNE)
  for i = 1, #gone do drop_item(gone[i]) end
  return #gone
end

-- The shard's indexes after the namespace changed: listed while it has an item, with the expiry
-- of its last item when every item has one.
local function reindex_namespace()
  local path = store_path()
  local count = redis.call('ZCARD', KEYS[2])
  if count == 0 then
    redis.call('ZREM', KEYS[5], path)
    redis.call('ZREM', KEYS[6], path)
    return
  end
  redis.call('ZADD', KEYS[5], 0, path)
  if redis.call('ZCARD', KEYS[3]) < count then
    redis.call('ZREM', KEYS[6], path)
  else
    local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
    redis.call('ZADD', KEYS[6], last[2], path)
  end
end

-- True when ``key`` has a TTL that passed at ``now``.
local function item_expired(key, now)
  local expiry = redis.call('ZSCORE', KEYS[3], key)
  return expiry ~= false and tonumber(expiry) < now
end

-- The live items of the namespace after insertion number ``after`` ('' from the first), at most
-- ``limit`` scanned, appended to ``out`` as key, item[, vectors]; ``mode`` '1': with the packed
-- vectors; returns the insertion number of the last item scanned
-- when the page was full, else ''.
-- Corrupt reply 2 (returned as its second value) when the order index names a key without an item.
local function item_page(after, limit, mode, out)
  local now = server_now_ms()
  local start = '-inf'
  if after ~= '' then start = '(' .. after end
  local page = redis.call('ZRANGEBYSCORE', KEYS[2], start, '+inf', 'WITHSCORES', 'LIMIT', 0, limit)
  for i = 1, #page, 2 do
    local key = page[i]
    if not item_expired(key, now) then
      local blob = redis.call('HGET', KEYS[1], key)
      if not blob then return '', corrupt(2, 'orphan') end
      out[#out + 1] = key
      out[#out + 1] = blob
      if mode == '1' then out[#out + 1] = redis.call('HGET', KEYS[4], key) or '' end
    end
  end
  if limit > 0 and #page == 2 * limit then return page[#page] end
  return ''
end

-- One page of the paths of index ``index`` in the lex range start..stop, at most ``limit``,
-- appended to ``out``, leaving out a path whose every item expired (by ``expiries``) unless
-- ``all``; returns the last path scanned when the page was full, else ''.
local function namespace_page(index, expiries, start, stop, limit, all, out)
  local now = server_now_ms()
  local page = redis.call('ZRANGEBYLEX', index, start, stop, 'LIMIT', 0, limit)
  for i = 1, #page do
    local expiry = redis.call('ZSCORE', expiries, page[i])
    if all or not expiry or tonumber(expiry) >= now then out[#out + 1] = page[i] end
  end
  if #page == limit then return page[#page] end
  return ''
end
