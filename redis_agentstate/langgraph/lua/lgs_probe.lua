-- lgs_probe.lua: one page of one inverted list of a LangGraph store namespace's vector index
-- (read-only): the live items whose vectors the list holds (the client reads their vectors with
-- HMGET and ranks them exactly).
--   KEYS[1..12] - the namespace's keys and its shard's indexes (see _lgs.lua)
--   ARGV[1]    - score: the list's score in KEYS[10] (version * LIST_SPAN + list)
--   ARGV[2]    - offset of the page in the list
--   ARGV[3]    - page size (members scanned)
-- Returns {next, key, key, ...}: next is the offset of the next page when this one was full, ''
-- when the list is done; each key once per page, left out when its item is gone or expired.
local score, offset, limit = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])

local now = server_now_ms()
local page = redis.call('ZRANGEBYSCORE', KEYS[10], score, score, 'LIMIT', offset, limit)
local out = { '' }
local seen = {}
for i = 1, #page do
  local key = string.match(page[i], '^(.*)%z%d+$') or page[i]
  if not seen[key] then
    seen[key] = true
    if not item_expired(key, now) and redis.call('HEXISTS', KEYS[1], key) == 1 then out[#out + 1] = key end
  end
end
if #page == limit then out[1] = fmt(offset + limit) end
return out
