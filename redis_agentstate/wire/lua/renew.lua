-- renew.lua: extend a live lease held by this token at this revision.
--   KEYS[1..7] - the task's keys (see _common.lua)
--   ARGV[1]    - token: the claim token
--   ARGV[2]    - expected_revision: the one the claim returned
--   ARGV[3]    - lease_ms: the new lease duration, counted from now on the server clock
--   ARGV[4]    - permit_key: the concurrency key of the place renewed for it ('' for none)
--   ARGV[5]    - permit_cap: that place's expiry, server ms (0 for none; the limits note in _common.lua)
-- An already expired lease is not revived: another worker may be about to
-- claim, and the holder must treat its lease as lost. A lease shortened (to
-- release the claim) publishes notify_due (_common.lua); Lease.release has its own script (release.lua).
-- Returns {REPLY_DONE, lease_expires_at_ms} renewed; {REPLY_TERMINAL, 'cancelled', reason} not
-- renewed because the task was cancelled (cancel.lua); {REPLY_LIMITED, key} not renewed: the task
-- has concurrency key ``key`` and no live place of it came; {REPLY_REFUSED} not renewed otherwise
-- ({REPLY_REFUSED, ms_left} when the token's lease is live but the revision is not its: a stale
-- renewal, the lease runs ms_left more and keeps its limiter place: the limits note in _common.lua);
-- an AGENTSTATE_CORRUPT error reply for a field this library would not write.
local token, expected, lease_ms = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local permit_key, permit_cap = ARGV[4], ARGV[5]

local h = redis.call('HMGET', KEYS[1], 'rev', 'token', 'lease', 'prio', 'ckey')
if not h[1] then return {REPLY_REFUSED} end
if not int_in(h[1], 0, MAX_REVISION) then return corrupt(1, 'rev') end
if h[3] and h[3] ~= '' and not int_in(h[3], 0, MAX_REVISION) then return corrupt(1, 'lease') end
if h[4] and h[4] ~= '' and not priority_of(h[4]) then return corrupt(1, 'prio') end
local now = server_now_ms()
if tonumber(h[1]) ~= expected or h[2] ~= token or (tonumber(h[3]) or 0) <= now then
  -- The refusal says why when the task was cancelled: the holder's lease is lost with the cancel as
  -- its cause (read only on this path: a renewal that passes costs nothing more).
  local why = redis.call('HMGET', KEYS[1], 'status', 'why')
  if why[1] == 'cancelled' then return {REPLY_TERMINAL, 'cancelled', why[2] or ''} end
  return refused_to(KEYS, token)
end
if h[5] and #h[5] > MAX_CKEY_BYTES then return corrupt(1, 'ckey') end
local expires = permitted_expiry(h[5], permit_key, permit_cap, now, lease_ms)
if not expires then return {REPLY_LIMITED, h[5]} end
-- The index first: if it is of another Redis type, nothing is written.
redis.call('ZADD', KEYS[4], fmt(ready_score(h[4], expires)), task_id_of(KEYS[1]))
redis.call('HSET', KEYS[1], 'lease', fmt(expires))
-- A release (a lease shortened to after_ms) makes the task due sooner: wake a waiter.
if expires < tonumber(h[3]) then notify_due(KEYS[4], expires - now, task_id_of(KEYS[1])) end
return {REPLY_DONE, fmt(expires)}
