-- lgs_train.lua: install a new version of a LangGraph store namespace's vector index, hold or
-- finish the move of its items to it (the client trains the centroids; see _store_ann.py).
--   KEYS[1..12] - the namespace's keys and its shard's indexes (see _lgs.lua)
--   ARGV[1]    - op: 'train', 'claim' or 'finish'
--   ARGV[2]    - expected: the version the client read (the compare-and-set)
--   ARGV[3]    - token of the mover (a re-sent call of the same mover answers as the first)
--   ARGV[4]    - lease_ms: how long the mover holds the move without a sign of life
--   ARGV[5]    - centroids ('train': float32, unit length; else '')
--   ARGV[6]    - lists ('train': how many centroids; else '')
--   ARGV[7]    - vectors ('train': the vector count it trained at; else '')
-- 'train': when the version is ARGV[2] and no move is under way, version ARGV[2] + 1 gets the
-- centroids, and its mover (ARGV[3]) holds the move of the items of version ARGV[2] until its
-- lease lapses. 'claim': a mover takes over a move whose lease lapsed. 'finish': once no item is
-- left in a list of the version moved from, its centroids go and the move ends.
-- Returns {DONE, version} when done (or already done by this token), {REFUSED, version} otherwise.
local op, expected, token, lease_ms = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local centroids, lists, vectors = ARGV[5], ARGV[6], ARGV[7]

local now = server_now_ms()
local current = index_version()
local state = redis.call('HMGET', KEYS[12], 'pv', 'by', 'lease')
local from, by, lease = state[1], state[2], tonumber(state[3] or '0')
if op == 'train' then
  if current == expected + 1 and by == token then return { REPLY_DONE, current } end
  if current ~= expected or from then return { REPLY_REFUSED, current } end
  local version = current + 1
  redis.call('HSET', KEYS[12], 'v', version, 'c:' .. fmt(version), centroids, 'k:' .. fmt(version), lists,
    'n', vectors, 'pv', current, 'by', token, 'lease', now + lease_ms)
  return { REPLY_DONE, version }
end
if current ~= expected then return { REPLY_REFUSED, current } end
if op == 'claim' then
  if not from then return { REPLY_REFUSED, current } end
  if by ~= token and lease > now then return { REPLY_REFUSED, current } end
  redis.call('HSET', KEYS[12], 'by', token, 'lease', now + lease_ms)
  return { REPLY_DONE, current }
end
if not from then return { REPLY_DONE, current } end
local base = tonumber(from) * LIST_SPAN
if redis.call('ZCOUNT', KEYS[10], base, base + LIST_SPAN - 1) > 0 then return { REPLY_REFUSED, current } end
redis.call('HDEL', KEYS[12], 'pv', 'by', 'lease', 'c:' .. from, 'k:' .. from)
return { REPLY_DONE, current }
