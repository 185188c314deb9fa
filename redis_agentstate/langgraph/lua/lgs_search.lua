-- lgs_search.lua: one page of the live items of one LangGraph store namespace, in insertion
-- order (read-only; the client filters and ranks them).
--   KEYS[1..12] - the namespace's keys and its shard's indexes (see _lgs.lua)
--   ARGV[1]    - the insertion number to start after ('' for the first page)
--   ARGV[2]    - page size (items scanned, expired ones included)
--   ARGV[3]    - '0': items; '1': each item with its packed vectors ('' when it has none)
-- Returns {next, key, item[, vectors], key, item[, vectors], ...}: next is the insertion number of the last item scanned when the page was full (pass it
-- as ARGV[1] for the next page), '' when the namespace is done.
-- Corrupt reply 2 when the order index names a key without an item.
local out = { '' }
local after, err = item_page(ARGV[1], tonumber(ARGV[2]), ARGV[3], out)
if err then return err end
out[1] = after
return out
