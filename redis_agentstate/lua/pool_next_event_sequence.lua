-- pool_next_event_sequence.lua: the pool's next event number (1, 2, 3, ...).
--   KEYS[1..10] - the pool's keys (see _pool.lua)
-- Returns {POOL_NOT_OPEN}; {POOL_DONE, n}. No record is appended (as in the seed);
-- a re-send after a lost reply may skip a number, never repeat one.
if not is_open() then return { POOL_NOT_OPEN } end
return { POOL_DONE, redis.call('HINCRBY', KEYS[1], 'evt', 1) }
