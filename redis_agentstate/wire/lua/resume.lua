-- resume.lua: a person answered: a task waiting in 'wait_user' runs again, their message appended.
--   KEYS[1..7] - the task's keys (see _common.lua)
--   KEYS[8]    - the shard's parked index (see _common.lua): not written (a waiting task is never
--                parked: parking holds a running one), sent for the common layout
--   KEYS[9]    - the shard's counters (see _common.lua): a resume applied now is counted ('resumes')
--   ARGV[1]    - nonce: of this call (a re-send after a lost reply returns REPLY_DONE_BEFORE)
--   ARGV[2]    - has_message: '1' when ARGV[3] is a message blob to append, '0' for none
--   ARGV[3]    - message: the blob, appended to the messages list as a commit appends (O(1): the
--                history's epoch stays, so every client's cached history stays valid)
-- The status becomes 'running', the due time is cleared (the next cycle is due now: the ready
-- index scores it now and notify_due wakes a blocked claim_next, as create does), and the
-- revision is bumped; attempts and the last failure start again (a fresh attempt). A claim held on the task (a worker handling the wait's deadline, see the
-- timers note in _common.lua) is cleared: the answer wins over the timeout, whose commit is
-- fenced out with nothing written.
-- Returns {REPLY_DONE, revision} resumed now; {REPLY_DONE_BEFORE} this nonce resumed it already;
-- {REPLY_REFUSED} no such task; {REPLY_NOT_WAITING, status} the task is not in 'wait_user'
-- (terminal, running, pending, ...: nothing written); an AGENTSTATE_CORRUPT error reply for a
-- field this library would not write (nothing written).
local nonce, has_message, message = ARGV[1], ARGV[2], ARGV[3]

local h, applied, early = nonce_decision(KEYS, nonce)
if early then return early end
if h[1] ~= WAIT_USER or is_terminal(h[1], h[7]) or h[11] == '1' then return {REPLY_NOT_WAITING, h[1]} end

local now = server_now_ms()
local task_id = task_id_of(KEYS[1])
local rev = tonumber(h[3]) + 1
-- Every key written below was type-checked first: a failure writes nothing.
probe(2, 4, 5)
if has_message == '1' then redis.call('RPUSH', KEYS[2], message) end
redis.call('HSET', KEYS[1], 'status', 'running', 'rev', fmt(rev), 'token', '', 'claimed', '', 'lease', '',
  'due', '', 'att', '0', 'why', '', 'failrev', '', 'applied', ring_push(applied, nonce))
reindex(KEYS[4], KEYS[5], task_id, 'running', h[7], '', '', now, '', h[15])
count(KEYS[9], 'resumes')
return {REPLY_DONE, fmt(rev)}
