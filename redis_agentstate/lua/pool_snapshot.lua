-- pool_snapshot.lua: the pool's whole state at one moment (read-only).
--   KEYS[1..8] - the pool's keys (see _pool.lua)
-- Returns {-1} never opened; {1, snapshot...} (layout in _pool.lua).
if not is_open() then return { -1 } end
return snapshot({ 1 })
