-- delete.lua: remove a task and its index entries, whatever its state.
--   KEYS[1..7] - the task's keys (see _common.lua)
--   KEYS[8]    - the shard's parked index (see _common.lua)
--   KEYS[9]    - the shard's counters (see _common.lua): not written, sent for the common layout
--   KEYS[10]   - the task's step results (see _common.lua): removed with the task
-- Returns the number of task keys removed.
-- The task's own keys are removed whatever they hold (this is how a corrupt
-- task is cleared); the shard indexes must be ours before anything is.
local task_id = task_id_of(KEYS[1])
probe(4, 5, 8)
redis.call('ZREM', KEYS[4], task_id)
redis.call('ZREM', KEYS[5], task_id)
redis.call('ZREM', KEYS[8], task_id)
local removed = redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[7])
-- Not counted: the number is of the task's history and tombstone, as before steps were kept.
redis.call('DEL', KEYS[10])
return removed
