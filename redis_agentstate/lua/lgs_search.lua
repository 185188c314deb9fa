-- lgs_search.lua: one page of the live items of one LangGraph store namespace, in insertion
-- order (read-only; the client filters and ranks them).
--   KEYS[1..6] - the namespace's keys and its shard's indexes (see _lgs.lua)
--   ARGV[1]    - the insertion number to start after ('' for the first page)
--   ARGV[2]    - page size (items scanned, expired ones included)
--   ARGV[3]    - '1': each item comes with its packed vectors ('' when it has none)
-- Returns {next, key, item[, vectors], key, item[, vectors], ...}: next is the insertion
-- number of the last item scanned when the page was full (pass it as ARGV[1] for the next
-- page), '' when the namespace is done.
-- Corrupt reply 2 when the order index names a key without an item.
local after, limit, with_vectors = ARGV[1], tonumber(ARGV[2]), ARGV[3] == '1'

local now = server_now_ms()
local start = '-inf'
if after ~= '' then start = '(' .. after end
local page = redis.call('ZRANGEBYSCORE', KEYS[2], start, '+inf', 'WITHSCORES', 'LIMIT', 0, limit)
local out = { '' }
if #page == 2 * limit then out[1] = page[#page] end
for i = 1, #page, 2 do
  local key = page[i]
  if not item_expired(key, now) then
    local blob = redis.call('HGET', KEYS[1], key)
    if not blob then return corrupt(2, 'orphan') end
    out[#out + 1] = key
    out[#out + 1] = blob
    if with_vectors then out[#out + 1] = redis.call('HGET', KEYS[4], key) or '' end
  end
end
return out
