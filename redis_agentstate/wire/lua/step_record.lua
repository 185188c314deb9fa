-- step_record.lua: store the result of a durable step of the claimed cycle, fenced by the lease.
--   KEYS[1]    - the task's checkpoint hash (KEYS[1] of _common.lua's layout)
--   KEYS[2]    - the task's step results (KEYS[10] of _common.lua's layout):
--                hash '<cycle>\0<name>' -> result blob
--   ARGV[1]    - token: the claim token that holds the cycle
--   ARGV[2]    - expected_revision: the one the claim returned
--   ARGV[3]    - cycle_index: the claimed cycle
--   ARGV[4]    - name: the step's name (the client checked it: no NUL)
--   ARGV[5]    - result: blob (codec.encode, size-checked by the client)
-- The lease must be live on the server clock (as step_load.lua): a holder whose
-- lease lapsed records nothing, even while nobody else has claimed, so that it
-- never goes on as if its step were recorded when another attempt may be running
-- it. The results of a cycle are dropped when the cycle is written (apply_fenced
-- in _common.lua), and the task's deletion drops them all.
-- Returns {REPLY_DONE} stored; {REPLY_REFUSED} the lease is not current, nothing
-- written; an AGENTSTATE_CORRUPT error reply for a field this library would not write.
local token, expected, cycle, name, result = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4], ARGV[5]

local stale = lease_not_current(KEYS, token, expected, cycle)
if stale then return stale end
redis.call('HSET', KEYS[2], cycle .. '\0' .. name, result)
return {REPLY_DONE}
