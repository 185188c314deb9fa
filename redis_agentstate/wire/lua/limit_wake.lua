-- limit_wake.lua: make a task that claim_next put off because its concurrency key was full
-- due now, since a place of that key freed (limit_release.lua, limit_set.lua hand it back).
--   KEYS[1..7] - the task's keys (see _common.lua)
--   ARGV[1]    - concurrency_key: the key whose place freed
--   ARGV[2]    - since_ms: when the task was put off (limiter clock): its place in line
-- Only a task still put off for that key is touched: it exists, is not terminal or parked, is
-- schedulable and due (by its hash), has that key, no live claim, and its ready entry is later
-- than now. Its entry moves back to when it was put off (now at the latest: it has waited that
-- long, ahead of the work that came due since) and blocked claim_next callers are woken.
-- Returns REPLY_DONE woken, REPLY_REFUSED nothing to do (claimed, finished or woken since: the caller may wake the
-- next one); an AGENTSTATE_CORRUPT error reply for a field this library would not write.
local ckey, since = ARGV[1], tonumber(ARGV[2])

local h = redis.call('HMGET', KEYS[1], unpack(HASH_FIELDS))
if not present(h) then return REPLY_REFUSED end
local bad = bad_field(h)
if bad then return corrupt(1, bad) end
local now = server_now_ms()
local task_id = task_id_of(KEYS[1])
if h[16] ~= ckey or is_terminal(h[1], h[7]) or h[11] == '1' or not schedulable(h[1], h[14]) then return REPLY_REFUSED end
if h[4] ~= '' and (tonumber(h[6]) or 0) > now then return REPLY_REFUSED end
if (tonumber(h[14] or '') or 0) > now then return REPLY_REFUSED end
local score = redis.call('ZSCORE', KEYS[4], task_id)
local want = ready_score(h[15], math.min(now, since))
if score and tonumber(score) <= want then return REPLY_REFUSED end
redis.call('ZADD', KEYS[4], fmt(want), task_id)
notify_due(KEYS[4], 0, task_id)
return REPLY_DONE
