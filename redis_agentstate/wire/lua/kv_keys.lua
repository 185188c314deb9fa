-- kv_keys.lua: one page of the live keys of one shard, in lex order (read-only).
--   KEYS[1..2] - the shard's kvkeys and kvttl (see _kv.lua)
--   ARGV[1]    - lex range start: '-' for the first page, '(' .. last key after that
--   ARGV[2]    - page size
-- Returns {next, key, key, ...}: next is the last key scanned when the page
-- was full (pass '(' .. next for the next page), '' when the shard is done.
-- Keys whose expiry has passed on the server clock are left out.
local start, limit = ARGV[1], tonumber(ARGV[2])

local now = server_now_ms()
local page = redis.call('ZRANGEBYLEX', KEYS[1], start, '+', 'LIMIT', 0, limit)
local out = { '' }
if #page == limit then out[1] = page[#page] end
for i = 1, #page do
  local expiry = redis.call('ZSCORE', KEYS[2], page[i])
  if not expiry or tonumber(expiry) >= now then out[#out + 1] = page[i] end
end
return out
