-- acknowledge_terminal.lua: delete a terminal checkpoint at the expected revision.
--   KEYS[1..7] - the task's keys (see _common.lua)
--   KEYS[8..9] - the shard's parked index and counters (see _common.lua): not written, sent for
--                the common layout
--   KEYS[10]   - the task's step results (see _common.lua): removed with the task
--   ARGV[1]    - identity: of this acknowledgement ('ack:<revision>'); kept in
--                the tombstone KEYS[7] for ARGV[3] ms so that a re-send (by
--                anyone) still returns REPLY_DONE
--   ARGV[2]    - expected_revision
--   ARGV[3]    - tomb_ms: how long the tombstone is kept, in ms
-- A task is acknowledged when it holds a terminal result, or was cancelled (cancel.lua).
-- Returns REPLY_DONE deleted (or this revision acknowledged already, or the
-- task expired at this revision: terminal_ttl_ms, see expire_terminal in
-- _common.lua, while its tombstone lasts); REPLY_REFUSED otherwise.
local id, expected, tomb_ms = ARGV[1], tonumber(ARGV[2]), ARGV[3]

local h = redis.call('HMGET', KEYS[1], 'rev', 'term', 'applied', 'status')
-- Deleting comes first: a task created again since an earlier acknowledgement
-- and terminal at the same revision must be deleted, not reported as done
-- from the old tombstone.
if h[1] then
  if not int_in(h[1], 0, MAX_REVISION) then return corrupt(1, 'rev') end
  probe(2, 3, 4, 5, 7)
end
-- A terminal result stored, or a cancel (cancel.lua: terminal without a result).
if h[1] and tonumber(h[1]) == expected and (h[2] == '1' or h[4] == 'cancelled') then
  local task_id = task_id_of(KEYS[1])
  redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[10])
  redis.call('ZREM', KEYS[4], task_id)
  redis.call('ZREM', KEYS[5], task_id)
  -- The tombstone keeps the task's write ring, so a re-sent commit/finalize is still recognised.
  redis.call('SET', KEYS[7], ring_push(h[3], id), 'PX', tomb_ms)
  return REPLY_DONE
end
-- Nothing to delete now: an acknowledgement of this revision that applied
-- already (the task may have been created again since) is recognised.
local tomb = redis.call('GET', KEYS[7])
if ring_has(tomb, id) then return REPLY_DONE end
-- Gone by its expiry at this very revision: what acknowledging would have done.
if not h[1] and ring_has(tomb, 'exp:' .. fmt(expected)) then return REPLY_DONE end
return REPLY_REFUSED
