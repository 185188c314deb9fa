-- claim.lua: claim cycle N of a task under a lease computed on the server clock.
--   KEYS[1..7] - the task's keys (see _common.lua)
--   KEYS[8]    - the shard's parked index (see _common.lua)
--   KEYS[9]    - the shard's counters (see _common.lua): counts a fresh claim (and a takeover)
--   ARGV[1]    - token: the claim token (non-empty)
--   ARGV[2]    - cycle_index: N to claim (the checkpoint must be at N - 1)
--   ARGV[3]    - lease_ms: lease duration in ms
--   ARGV[4]    - have_epoch: cached history epoch (as load.lua)
--   ARGV[5]    - have_m: cached messages
--   ARGV[6]    - have_c: cached cycle records
--   ARGV[7]    - max_attempts: the store's limit of attempts per cycle (0: none)
--   ARGV[8]    - permit_key: the concurrency key of the place taken for this claim ('' for none)
--   ARGV[9]    - permit_cap: that place's expiry, server ms (0 for none; the limits note in _common.lua)
-- Returns {REPLY_REFUSED} missing; {REPLY_TERMINAL, status};
-- {REPLY_NOT_RUNNING, status}; {REPLY_CYCLE_CONFLICT, found_cycle};
-- {REPLY_HELD, lease_expires_at_ms} claimed by another live token;
-- {REPLY_LIMITED, key} the task has concurrency key ``key`` and the claim came without a live
-- place of that key's limiter (the limits note in _common.lua);
-- {REPLY_REVISION_EXHAUSTED, rev} the revision is too high for this claim's
-- commit to be stored (MAX_CLAIM_FROM_REV); {REPLY_DONE, checkpoint...}
-- claimed (revision bumped); {REPLY_TAKEN_OVER, checkpoint...} the same, taken
-- from another token whose lease had lapsed without a commit (a takeover);
-- {REPLY_DONE_BEFORE, checkpoint...} this token
-- already holds this cycle (a re-sent claim);
-- {REPLY_PARKED, attempts, reason} the task is parked;
-- {REPLY_PARKED, attempts, reason, '1'} parked now: this claim would have been
-- attempt max_attempts + 1 (_common.lua);
-- an AGENTSTATE_CORRUPT error reply when the hash holds a field this library
-- would not have written (nothing is written then).
local token, cycle_arg, lease_ms = ARGV[1], ARGV[2], tonumber(ARGV[3])
local epoch, have_m, have_c = ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6])
local max_attempts = tonumber(ARGV[7])
local permit_key, permit_cap = ARGV[8], ARGV[9]

return claim_cycle(KEYS, token, cycle_arg, lease_ms, epoch, have_m, have_c, max_attempts, permit_key, permit_cap)
