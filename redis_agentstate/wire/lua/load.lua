-- load.lua: read a whole checkpoint in one consistent step.
--   KEYS[1..7] - the task's keys (see _common.lua)
--   ARGV[1]    - have_epoch: the history epoch the caller has cached ('' for none)
--   ARGV[2]    - have_m: messages the caller has cached for that epoch
--   ARGV[3]    - have_c: cycle records the caller has cached for that epoch
-- Returns {} when the task does not exist, else read_checkpoint's array; an
-- AGENTSTATE_CORRUPT error reply for a field this library would not write.
local epoch, have_m, have_c = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])

local h = redis.call('HMGET', KEYS[1], unpack(HASH_FIELDS))
if not present(h) then return {} end
local bad = bad_field(h)
if bad then return corrupt(1, bad) end
return read_checkpoint(KEYS, epoch, have_m, have_c, h)
