-- limit_register.lua: record a concurrency key's limit in the namespace's registry of limited
-- keys (what `agentstate stats` lists), or drop it.
--   KEYS[1]    - ns:{ns#00}:limits  hash  concurrency key -> its limit
--   ARGV[1]    - concurrency_key: the key
--   ARGV[2]    - limit: its limit (a decimal), or '' to drop the key
-- limit_set.lua writes the limit itself first, in the key's own slot: the registry only names
-- the keys (a crash between the two leaves the limit in force and the registry a call behind,
-- which the next set_concurrency_limit of the key catches up). Returns REPLY_DONE.
local ckey, limit = ARGV[1], ARGV[2]

if limit == '' then
  redis.call('HDEL', KEYS[1], ckey)
else
  redis.call('HSET', KEYS[1], ckey, limit)
end
return REPLY_DONE
