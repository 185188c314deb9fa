-- lgs_pick.lua: the items a ranking from a client's cache of one LangGraph store namespace's
-- vectors picked, read only while the namespace is as the cache holds it (_store_cache.py);
-- refreshes their TTL if asked.
--   KEYS[1..12] - the namespace's keys and its shard's indexes (see _lgs.lua)
--   ARGV[1]    - the write version the cache holds (lgs_scan.lua's)
--   ARGV[2]    - '1': each item returned that has a TTL expires its TTL after now; '0': read only
--   ARGV[3]    - how many of the keys (the first ones: ranked before the search's offset) are
--                checked only, not returned
--   ARGV[4..]  - the keys, in the ranking's order
-- Returns {version} when the write version is not ARGV[1] (nothing read or refreshed); else
-- {version, entry, ...}, one entry per key: false when absent or expired, '1' for a live key that
-- is checked only, else the stored item. A TTL is refreshed only when every key is live (a pick
-- with a gap is ranked again, by the caller).
-- Corrupt reply 12 when the write version is not one we wrote; 1 when an item does not start with
-- the header lgs_put writes.
local expected, refresh, skip = ARGV[1], ARGV[2] == '1', tonumber(ARGV[3])

local version = write_version()
if not version then return corrupt(12, 'version') end
if version ~= expected then return { version } end
local now = server_now_ms()
local out = { version }
local whole = true
for i = 4, #ARGV do
  local key = ARGV[i]
  local blob = redis.call('HGET', KEYS[1], key)
  if blob and item_expired(key, now) then blob = false end
  if blob then
    if not item_header(blob) then return corrupt(1, 'item') end
    if i - 3 <= skip then blob = '1' end
  else
    whole = false
  end
  out[#out + 1] = blob
end
if refresh and whole then
  local refreshed = false
  for i = 4 + skip, #ARGV do
    local ttl = select(3, item_header(out[i - 2]))
    if ttl ~= '' then
      redis.call('ZADD', KEYS[3], now + tonumber(ttl), ARGV[i])
      refreshed = true
    end
  end
  if refreshed then reindex_namespace() end
end
return out
