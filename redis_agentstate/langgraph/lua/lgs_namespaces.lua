-- lgs_namespaces.lua: one page of the LangGraph store namespaces of one shard's index, in lex
-- order (read-only).
--   KEYS[1] - ns:{ns#SS}:lgsns  zset  namespace paths with an item (score 0, see _lgs.lua)
--   KEYS[2] - ns:{ns#SS}:lgsnx  zset  path -> expiry of its last item to expire (see _lgs.lua)
--   ARGV[1] - lex range start ('-', '[<path>' or '(<path>')
--   ARGV[2] - lex range end ('+' or '(<path>')
--   ARGV[3] - page size
--   ARGV[4] - '1': list namespaces whose every item expired too (what a sweep visits)
--   ARGV[5..] - if given: no range (ARGV[1..3] are ignored): which of these paths the index
--               lists (a prefix's listing checked in each path's own shard)
-- Returns {next, path, path, ...}: next is the last path scanned when the page was full (pass
-- '(' .. next as ARGV[1] for the next page), '' when the range is done. A namespace whose
-- every item expired on the server clock is left out unless ARGV[4] is '1'.
local all = ARGV[4] == '1'
local out = { '' }
if #ARGV > 4 then
  local now = server_now_ms()
  for i = 5, #ARGV do
    if redis.call('ZSCORE', KEYS[1], ARGV[i]) then
      local expiry = redis.call('ZSCORE', KEYS[2], ARGV[i])
      if all or not expiry or tonumber(expiry) >= now then out[#out + 1] = ARGV[i] end
    end
  end
  return out
end
out[1] = namespace_page(KEYS[1], KEYS[2], ARGV[1], ARGV[2], tonumber(ARGV[3]), all, out)
return out
