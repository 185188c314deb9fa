-- lgs_index.lua: list or unlist LangGraph store namespaces in the index of the shard of one of
-- their proper prefixes (so that a search of the prefix reads that shard alone; see _lgs.lua).
--   KEYS[1] - ns:{ns#SS}:lgsns  zset  namespace paths (score 0, lex order)
--   KEYS[2] - ns:{ns#SS}:lgsng  zset  path -> generation of its listing
--   ARGV[1..] - groups of three: '+' or '-', a path, the generation of its listing (lgs_put.lua
--             returns it: a new listing has a greater one than every listing before it)
-- '+' lists the path with that generation, unless it is listed with a later one (a late '+');
-- '-' unlists it if it is listed with exactly that generation (a listing that began since
-- stays). Returns the number of paths changed.
local changed = 0
for i = 1, #ARGV, 3 do
  local op, path, gen = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  local listed = redis.call('ZSCORE', KEYS[2], path)
  if op == '+' then
    if not listed or tonumber(listed) < gen then
      redis.call('ZADD', KEYS[2], gen, path)
      redis.call('ZADD', KEYS[1], 0, path)
      changed = changed + 1
    end
  elseif listed and tonumber(listed) == gen then
    redis.call('ZREM', KEYS[2], path)
    redis.call('ZREM', KEYS[1], path)
    changed = changed + 1
  end
end
return changed
