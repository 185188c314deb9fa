-- lgs_assign.lua: move items of a LangGraph store namespace to the lists of the index version a
-- re-train installed (lgs_train.lua), renewing the mover's lease.
--   KEYS[1..12] - the namespace's keys and its shard's indexes (see _lgs.lua)
--   ARGV[1]    - version: the index version the lists are of
--   ARGV[2]    - token of the mover
--   ARGV[3]    - lease_ms: its lease from now
--   ARGV[4..]  - pairs: key, lists (comma-separated, one per vector of the key, in the order of
--                its packed vectors, as the client read them after the re-train)
-- An item put since the re-train is in the lists of the version already (its put chose them) and
-- is left as it is; one whose vectors are gone leaves every list.
-- Returns {DONE, moved}, or {REFUSED, version} and writes nothing when ARGV[1] is not the index version.
local version, token, lease_ms = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])

local current = index_version()
if current ~= version then return { REPLY_REFUSED, current } end
local moved = 0
for i = 4, #ARGV, 2 do
  local key, lists = ARGV[i], ARGV[i + 1]
  if redis.call('HEXISTS', KEYS[4], key) == 1 then
    local score = redis.call('ZSCORE', KEYS[10], list_member(key, 1))
    if not score or math.floor(tonumber(score) / LIST_SPAN) ~= version then
      assign(key, version, lists)
      moved = moved + 1
    end
  else
    unassign(key)
  end
end
if redis.call('HGET', KEYS[12], 'by') == token then
  redis.call('HSET', KEYS[12], 'lease', server_now_ms() + lease_ms)
end
return { REPLY_DONE, moved }
