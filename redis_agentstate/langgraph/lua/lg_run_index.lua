-- lg_run_index.lua: the way from a run id to its thread (RunQueue.get, stream, join, cancel).
--   KEYS[1] - lgrid:<run_id>  string: the run's thread id (in the run id's shard, see keys.py)
--   ARGV[1] - thread id, or '' to delete the entry (a rolled-back run)
--   ARGV[2] - ttl: ms the entry is kept (a run's retention once it ended), '' for no expiry
-- Written before the run (so a run is found as soon as it exists); an entry whose run is gone
-- (rejected, expired, rolled back) answers "no such run" to its reader, which is what it is.
-- Returns {REPLY_DONE}. Setting or deleting the entry again leaves it as it was: a re-send is safe.
local tid, ttl = ARGV[1], ARGV[2]

if tid == '' then
  redis.call('DEL', KEYS[1])
elseif ttl == '' then
  redis.call('SET', KEYS[1], tid)
else
  redis.call('SET', KEYS[1], tid, 'PX', ttl)
end
return {REPLY_DONE}
