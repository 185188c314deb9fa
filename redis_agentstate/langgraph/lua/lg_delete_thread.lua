-- lg_delete_thread.lua: delete every checkpoint, blob and write of a thread.
--   KEYS[1..9] - the thread's keys (see _lg.lua)
--   ARGV[1]     - thread id
--   ARGV[2]     - lease token of the caller ('' = it holds no lease)
-- Returns {DONE} deleted; {REFUSED, 'busy'} / {REFUSED, 'lost'} refused by the lease (nothing deleted);
-- an AGENTSTATE_CORRUPT error reply if its run index is malformed (nothing deleted).
local tid, token = ARGV[1], ARGV[2]

probe()
local refused = fence(token, server_now_ms())
if refused ~= '' then return {REPLY_REFUSED, refused} end
if not drop_thread(tid) then return corrupt(6, 'run-member') end
return {REPLY_DONE}
