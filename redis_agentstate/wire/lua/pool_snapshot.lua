-- pool_snapshot.lua: one bounded page of the pool's state (read-only).
--   KEYS[1..10] - the pool's keys (see _pool.lua)
--   ARGV[1..3]  - HSCAN cursors of members, messages, wakes ('0' first, '' done)
--   ARGV[4]     - HSCAN COUNT per hash
-- Returns {POOL_NOT_OPEN}; {POOL_DONE, page...} (layout in _pool.lua).
local cursors, count = { ARGV[1], ARGV[2], ARGV[3] }, ARGV[4]

if not is_open() then return { POOL_NOT_OPEN } end
return snapshot_page({ POOL_DONE }, cursors, count)
