-- lg_run_wake.lua: after a GraphWorker put a thread's task to wait for work, wake it if a run came
-- meanwhile (a create that found the task still claimed did not: the task was not waiting).
--   KEYS[1..9] - the thread's task (keys.TaskKeys.counted(), the _common.lua layout)
--   KEYS[10]   - lgrq:<tid>  the thread's active runs (see _lgrun.lua)
--   ARGV[1]    - nonce of this wake
-- Returns {REPLY_DONE, 1 if woken now else 0, active runs}. A re-send (its nonce is in the task's
-- write ring, _common.lua) wakes nothing again: {REPLY_DONE, 0, active runs}.
local nonce = ARGV[1]

local n = redis.call('LLEN', KEYS[10])
local woke = 0
if n > 0 and wake_thread(nonce) then woke = 1 end
return {REPLY_DONE, woke, n}
