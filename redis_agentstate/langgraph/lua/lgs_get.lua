-- lgs_get.lua: read items of one LangGraph store namespace, refreshing their TTL if asked.
--   KEYS[1..12] - the namespace's keys and its shard's indexes (see _lgs.lua)
--   ARGV[1]    - '1': each item read that has a TTL expires its TTL after now; '0': read only
--   ARGV[2..]  - the keys
-- Returns one entry per key: the stored item, or false when absent or expired.
-- Corrupt reply 1 when an item does not start with the header lgs_put writes.
local refresh = ARGV[1] == '1'

local now = server_now_ms()
local out = {}
local refreshed = false
for i = 2, #ARGV do
  local key = ARGV[i]
  local blob = redis.call('HGET', KEYS[1], key)
  if blob and item_expired(key, now) then blob = false end
  if blob then
    local header = { item_header(blob) }
    if #header == 0 then return corrupt(1, 'item') end
    if refresh and header[3] ~= '' then
      redis.call('ZADD', KEYS[3], now + tonumber(header[3]), key)
      refreshed = true
    end
  end
  out[#out + 1] = blob
end
if refreshed then reindex_namespace() end
return out
