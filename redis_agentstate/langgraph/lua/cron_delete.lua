-- cron_delete.lua: delete one cron schedule: no tick of it fires after this call.
--   KEYS[1..3] - cron:<cron_id>, crondue, crons (see cron_put.lua)
--   ARGV[1]    - cron id
-- Returns {REPLY_DONE, 1} deleted, {REPLY_DONE, 0} there was none (deleted before: by this very
-- call before its reply was lost, or by another); nothing else is written, so a re-send is safe.
local existed = redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
return {REPLY_DONE, existed}
