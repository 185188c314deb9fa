-- step_load.lua: the stored result of a durable step of the claimed cycle, for the lease that holds it.
--   KEYS[1]    - the task's checkpoint hash (KEYS[1] of _common.lua's layout)
--   KEYS[2]    - the task's step results (KEYS[10] of _common.lua's layout):
--                hash '<cycle>\0<name>' -> result blob
--   ARGV[1]    - token: the claim token that holds the cycle
--   ARGV[2]    - expected_revision: the one the claim returned
--   ARGV[3]    - cycle_index: the claimed cycle
--   ARGV[4]    - name: the step's name (the client checked it: no NUL)
-- The lease must be live on the server clock (as renew.lua checks it): a
-- frozen holder woken after a takeover must not read the new holder's result
-- as its own, nor go on as if it still held the cycle.
-- Returns {REPLY_DONE, blob} stored; {REPLY_DONE} not stored (the step runs);
-- {REPLY_REFUSED} the lease is not current; an AGENTSTATE_CORRUPT error reply
-- for a field this library would not write.
local token, expected, cycle, name = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]

local stale = lease_not_current(KEYS, token, expected, cycle)
if stale then return stale end
local blob = redis.call('HGET', KEYS[2], cycle .. '\0' .. name)
if blob then return {REPLY_DONE, blob} end
return {REPLY_DONE}
