-- lgs_scan.lua: one page of the live items of one LangGraph store namespace as a client's cache of
-- its vectors keeps them (read-only; _store_cache.py): each key with its stamp, which every write
-- of the item changes, and the namespace's write version, read with the first page.
--   KEYS[1..12] - the namespace's keys and its shard's indexes (see _lgs.lua)
--   ARGV[1]    - the insertion number to start after ('' for the first page)
--   ARGV[2]    - page size (items scanned, expired ones included)
--   ARGV[3]    - the most bytes of items a page reads (it stops after the item that passes it)
--   ARGV[4]    - the most live items the caller takes: with more, the first page reads no item
-- Returns {version, live, next, items}: the write version, the live items (whose TTL has not
-- passed), the insertion number to pass as ARGV[1] for the next page ('' when the namespace is
-- done, or when live > ARGV[4] on the first page: then items is ''), and the page's live items in
-- one string (one reply, not two per item: a client parses it faster), each as
-- "<#key>:<key><#stamp>:<stamp>"; a stamp is "<updated>:<nonce>" of the item's header (a put within
-- the millisecond of the last one still moves updated on, and a call writes a key once: no two
-- writes of a key share one).
-- Corrupt reply 12 when the write version is not one we wrote; 2 when the order index names a
-- key without an item; 1 when an item does not start with the header lgs_put writes.
local after, limit, max_bytes, most = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])

local version = write_version()
if not version then return corrupt(12, 'version') end
local now = server_now_ms()
local live = redis.call('ZCARD', KEYS[2]) - redis.call('ZCOUNT', KEYS[3], '-inf', '(' .. fmt(now))
local out = { version, live, '', '' }
if after == '' and live > most then return out end
local start = '-inf'
if after ~= '' then start = '(' .. after end
local page = redis.call('ZRANGEBYSCORE', KEYS[2], start, '+inf', 'WITHSCORES', 'LIMIT', 0, limit)
local bytes = 0
local items = {}
for i = 1, #page, 2 do
  local key = page[i]
  if not item_expired(key, now) then
    local blob = redis.call('HGET', KEYS[1], key)
    if not blob then return corrupt(2, 'orphan') end
    local header = { item_header(blob) }
    if #header == 0 then return corrupt(1, 'item') end
    local stamp = header[2] .. ':' .. header[4]
    items[#items + 1] = #key .. ':' .. key .. #stamp .. ':' .. stamp
    bytes = bytes + #blob
    if bytes >= max_bytes and i + 1 < #page then
      out[3] = page[i + 1]
      break
    end
  end
end
if out[3] == '' and #page == 2 * limit then out[3] = page[#page] end
out[4] = table.concat(items)
return out
