-- load.lua: read a whole checkpoint in one consistent step.
--   KEYS[1..7] - the task's keys (see _common.lua)
--   ARGV[1]    - history epoch the caller has cached ('' for none)
--   ARGV[2]    - messages the caller has cached for that epoch
--   ARGV[3]    - cycle records the caller has cached for that epoch
-- Returns {} when the task does not exist, else read_checkpoint's array.
local epoch, have_m, have_c = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])

if redis.call('EXISTS', KEYS[1]) == 0 then return {} end
return read_checkpoint(KEYS, epoch, have_m, have_c)
