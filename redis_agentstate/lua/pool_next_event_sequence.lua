-- pool_next_event_sequence.lua: the pool's next event number (1, 2, 3, ...).
--   KEYS[1..10] - the pool's keys (see _pool.lua)
-- Returns {-1} never opened; {1, n}. No record is appended (as in the seed);
-- a re-send after a lost reply may skip a number, never repeat one.
if not is_open() then return { -1 } end
return { 1, redis.call('HINCRBY', KEYS[1], 'evt', 1) }
