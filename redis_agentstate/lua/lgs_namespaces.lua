-- lgs_namespaces.lua: one page of the LangGraph store namespaces of one shard, in lex order
-- (read-only).
--   KEYS[1] - ns:{ns#SS}:lgsns  zset  every namespace path of the shard with an item (score 0)
--   KEYS[2] - ns:{ns#SS}:lgsnx  zset  path -> expiry of its last item to expire (see _lgs.lua)
--   ARGV[1] - lex range start ('-', '[<path>' or '(<path>')
--   ARGV[2] - lex range end ('+' or '(<path>')
--   ARGV[3] - page size
--   ARGV[4] - '1': list namespaces whose every item expired too (what a sweep visits)
-- Returns {next, path, path, ...}: next is the last path scanned when the page was full (pass
-- '(' .. next as ARGV[1] for the next page), '' when the range is done. A namespace whose
-- every item expired on the server clock is left out unless ARGV[4] is '1'.
local start, stop, limit, all = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4] == '1'

local now = server_now_ms()
local page = redis.call('ZRANGEBYLEX', KEYS[1], start, stop, 'LIMIT', 0, limit)
local out = { '' }
if #page == limit then out[1] = page[#page] end
for i = 1, #page do
  local expiry = redis.call('ZSCORE', KEYS[2], page[i])
  if all or not expiry or tonumber(expiry) >= now then out[#out + 1] = page[i] end
end
return out
