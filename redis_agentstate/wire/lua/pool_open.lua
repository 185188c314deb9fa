-- pool_open.lua: open a pool, creating it (and its pool_opened record) if new.
--   KEYS[1..10] - the pool's keys (see _pool.lua)
--   ARGV[1]     - pool id (for the shard's pool index)
--   ARGV[2]     - config blob, canonically encoded (equal configs, equal bytes)
--   ARGV[3]     - max records to keep in the log (0 = all)
--   ARGV[4]     - HSCAN COUNT of the snapshot's first page
-- Returns {POOL_DONE, page...} created; {POOL_DONE_BEFORE, page...} already
-- open with this config (the snapshot's first page, layout in _pool.lua; the
-- client reads the rest); {POOL_CONFIG_CONFLICT, stored config blob} open with
-- different bytes (the client decides whether the values still compare equal).
local pool_id, config, maxlen, count = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local start = { '0', '0', '0' }

if is_open() then
  local stored = redis.call('HGET', KEYS[1], 'cfg')
  if stored ~= config then return { POOL_CONFIG_CONFLICT, stored or '' } end
  return snapshot_page({ POOL_DONE_BEFORE }, start, count)
end
-- The index first: if it is of another Redis type, nothing is written.
redis.call('ZADD', KEYS[8], 0, pool_id)
redis.call('HSET', KEYS[1], 'cfg', config, 'created', '0', 'seq', '0', 'evt', '0')
append('pool_opened', config, maxlen)
return snapshot_page({ POOL_DONE }, start, count)
