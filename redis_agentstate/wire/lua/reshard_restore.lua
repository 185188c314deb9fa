-- reshard_restore.lua: write a batch of one new shard's keys, copied from the old shard that
-- feeds it (core/reshard.py). The new shard is untouched by every client until the layout record
-- counts its old shard as moved (clients wait on the seal until then), so each write here sets
-- a key whole, and a reshard that stopped half-way copies it again to the same result.
--   KEYS[1]    - <new shard prefix>fence  string  the generation of the mover holding the slot
--                (reshard_fence.lua)
--   KEYS[2..]  - keys of the new shard (any kind keys.py lists; all of the fence's hash tag)
--   ARGV[1]    - the mover's generation
--   ARGV[2..]  - per key, in KEYS order: <how> <n> <n values>
--                how 'r': RESTORE; values: <absolute expiry ms, 0 for none> <DUMP payload>
--                how 'z': a split index; values: <score> <member> ... (ZADD, the members of
--                         this new shard)
-- Returns the number of keys written (a key whose expiry passed meanwhile is not), or 'fenced' (nothing
-- written) when the fence holds another mover's generation: a mover stalled with a stale copy,
-- and woken after a newer one moved the shard and workers wrote to it, never writes it back.
-- The expiry is absolute and turned into a TTL here, on the server's clock (RESTORE's ABSTTL
-- is not on every server this library runs against).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 'fenced'
end
local now = server_now_ms()
local written = 0
local at = 2
for i = 2, #KEYS do
  local how, n = ARGV[at], tonumber(ARGV[at + 1])
  local first = at + 2
  if how == 'r' then
    local expires = tonumber(ARGV[first])
    if expires == 0 then
      redis.call('RESTORE', KEYS[i], 0, ARGV[first + 1], 'REPLACE')
      written = written + 1
    elseif expires > now then
      redis.call('RESTORE', KEYS[i], expires - now, ARGV[first + 1], 'REPLACE')
      written = written + 1
    end
  else
    written = written + 1
    -- ZADD in slices: Lua's unpack has a bounded stack.
    for j = first, first + n - 1, 2000 do
      redis.call('ZADD', KEYS[i], unpack(ARGV, j, math.min(j + 1999, first + n - 1)))
    end
  end
  at = first + n
end
return written
