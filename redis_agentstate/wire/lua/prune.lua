-- prune.lua: drop the shard index entries of tasks whose checkpoint is gone
-- (expired: terminal_ttl_ms), as readers meet them; never a scan.
--   KEYS[1]    - ns:{ns#SS}:tasks   the shard's task index (see _common.lua)
--   KEYS[2]    - ns:{ns#SS}:ready   the shard's due index
--   KEYS[3]    - ns:{ns#SS}:parked  the shard's parked index
--   KEYS[4..]  - checkpoints: KEYS[1] of the task's keys (see _common.lua), of
--                tasks of that shard a reader found missing
-- A task created again since the reader looked has its hash: it is kept. The
-- entries go from every index (an expired task is terminal, so only in the
-- task index; the others are cleaned too, so no index can point at a missing
-- task, whatever removed it).
-- A write (scripts.WRITES), though only housekeeping the next reader would redo.
-- Returns the number of entries dropped from the task index.
local dropped = 0
for i = 4, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 0 then
    local task_id = task_id_of(KEYS[i])
    dropped = dropped + redis.call('ZREM', KEYS[1], task_id)
    redis.call('ZREM', KEYS[2], task_id)
    redis.call('ZREM', KEYS[3], task_id)
  end
end
return dropped
