-- lgs_prefix.lua: what a search of a namespace prefix reads first, from the prefix's own shard
-- (read-only): the paths under the prefix (every one is listed in this shard's index, see
-- _lgs.lua) and the first page of the items of the prefix's own namespace.
--   KEYS[1..12] - the keys of the prefix's namespace and its shard's indexes (see _lgs.lua)
--   ARGV[1]    - lex range start of the paths under the prefix ('[<path>')
--   ARGV[2]    - lex range end ('(<path>\1')
--   ARGV[3]    - page size of paths
--   ARGV[4]    - page size of items (0: no items)
--   ARGV[5]    - item mode, as lgs_search.lua's ARGV[3]
-- Returns {paths_next, n, path_1 .. path_n, items_next, key, item[, vectors], ...}: paths_next
-- is the last path scanned when the page of paths was full ('' when done; pass '(' .. it to
-- lgs_namespaces.lua for the next page), items_next as lgs_search.lua's next. A path of this
-- shard whose every item expired is left out; a path of another shard is listed while it is
-- (the caller reads it in its own shard).
-- Corrupt reply 2 when the order index names a key without an item.
local paths = {}
local paths_next = namespace_page(KEYS[5], KEYS[6], ARGV[1], ARGV[2], tonumber(ARGV[3]), false, paths)
local out = { paths_next, #paths }
for i = 1, #paths do out[#out + 1] = paths[i] end
local at = #out + 1
out[at] = ''
local items_next, err = item_page('', tonumber(ARGV[4]), ARGV[5], out)
if err then return err end
out[at] = items_next
return out
