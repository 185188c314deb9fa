-- release.lua: give a claimed cycle up, recording why (the failure of an attempt).
--   KEYS[1..7] - the task's keys (see _common.lua)
--   KEYS[8]    - the shard's parked index (see _common.lua)
--   ARGV[1]    - token: the claim token that holds the cycle
--   ARGV[2]    - expected_revision: the one the claim returned
--   ARGV[3]    - after_ms: the cycle is claimable again this long from now (server clock)
--   ARGV[4]    - reason: why the attempt failed ('' for none: not a failure)
--   ARGV[5]    - max_attempts: the store's limit of attempts per cycle (0: none)
-- Only the claim's holder releases it (token and revision must match); its
-- lease need not be live: with nobody claiming since, the claim is still its.
-- A release with a reason records it ('why'; 'failrev' marks the attempt as
-- released, not lapsed: _common.lua); when that attempt was attempt
-- max_attempts, the task is parked now instead. A release without a reason
-- (a shutdown handing the cycle back) is no failure: its attempt is given back.
-- A release that makes the task claimable publishes notify_due (_common.lua).
-- Returns {REPLY_DONE, claimable_at_ms} released; {REPLY_DONE_BEFORE, lease}
-- released already (a re-send: nothing written); {REPLY_PARKED, attempts,
-- reason, '1'} parked now; {REPLY_PARKED, attempts, reason} parked by this
-- very release before (a re-send after a lost reply);
-- {REPLY_REFUSED} not this token's claim any more ({REPLY_REFUSED, ms_left} the token's lease
-- is live but the revision is not its: a stale release, the lease keeps its limiter place: the
-- limits note in _common.lua); an AGENTSTATE_CORRUPT error reply for a field this library would not write.
local token, expected, after_ms = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local reason, max_attempts = ARGV[4], tonumber(ARGV[5])

local h = redis.call('HMGET', KEYS[1], unpack(HASH_FIELDS))
if not present(h) then return {REPLY_REFUSED} end
local bad = bad_field(h)
if bad then return corrupt(1, bad) end
local rev, att = tonumber(h[3]), tonumber(h[10]) or 0
if rev ~= expected or h[4] ~= token then
  -- Parked by this very release (a re-send after a lost reply): parking bumped the revision.
  if h[11] == '1' and h[13] == fmt(expected) and rev == expected + 1 then
    return {REPLY_PARKED, h[10], h[12]}
  end
  return refused_to(KEYS, token)
end
if h[13] == h[3] then return {REPLY_DONE_BEFORE, h[6]} end

local now = server_now_ms()
if reason ~= '' and max_attempts > 0 and att >= max_attempts then
  local out = park(KEYS, rev, att, reason, now)
  redis.call('HSET', KEYS[1], 'failrev', h[3])
  return out
end
if reason == '' and att > 0 then att = att - 1 end
local at = now + after_ms
-- The index first: if it is of another Redis type, nothing is written.
redis.call('ZADD', KEYS[4], fmt(ready_score(h[15], at)), task_id_of(KEYS[1]))
if reason == '' then
  redis.call('HSET', KEYS[1], 'lease', fmt(at), 'att', fmt(att), 'failrev', h[3])
else
  redis.call('HSET', KEYS[1], 'lease', fmt(at), 'att', fmt(att), 'failrev', h[3], 'why', reason)
end
-- Due sooner than its lease said: wake a blocked claim_next (_common.lua).
notify_due(KEYS[4], after_ms, task_id_of(KEYS[1]))
return {REPLY_DONE, fmt(at)}
