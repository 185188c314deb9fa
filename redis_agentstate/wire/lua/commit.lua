-- commit.lua: write the checkpoint of a claimed cycle, fenced by revision.
--   KEYS[1..7] - the task's keys (see _common.lua)
--   KEYS[8]    - the shard's parked index (see _common.lua): not written (a commit never
--                finds its task parked: parking clears the claim), sent for the common layout
--   KEYS[9]    - the shard's counters (see _common.lua): a commit applied now is counted
--   KEYS[10]   - the task's step results (see _common.lua): dropped by a commit applied now
--   ARGV[1]    - identity: of this write, a digest of its content (a re-send returns REPLY_DONE_BEFORE)
--   ARGV[2]    - token: the claim token that holds the cycle
--   ARGV[3]    - expected_revision: the one the claim returned
--   ARGV[4]    - cycle_index: of the checkpoint (must equal the claimed cycle)
--   ARGV[5]    - status
--   ARGV[6]    - term: '1' if the body carries a terminal_result
--   ARGV[7]    - body: blob (as create.lua)
--   ARGV[8]    - ttl_ms: the store's terminal_ttl_ms, 0 for none: a terminal write sets the
--                task's expiry (expire_terminal in _common.lua)
--   ARGV[9]    - delay_ms: 0, or the next cycle is not claimable before this long from now (server
--                clock); with status 'wait_user', the wait's deadline (the timers note in _common.lua)
--   ARGV[10]   - priority: the task's priority from now on (the priorities note in _common.lua)
--   ARGV[11]   - concurrency_key: the task's from now on ('' for none; the limits note in _common.lua)
--   ARGV[12]   - replace: '1' to replace the whole history, '0' to append
--   ARGV[13]   - epoch: the history epoch the client believes current ('' if unknown)
--   ARGV[14]   - base_m: messages the client knows are stored; -1 = full lists sent
--   ARGV[15]   - base_c: the same for cycle records
--   ARGV[16]   - n_messages: number of message blobs
--   ARGV[17..] - blobs: the new message blobs, then the new cycle blobs
-- The lease need not be unexpired: if nobody claimed since, the revision is
-- unchanged and the fence holds.
-- Returns {REPLY_DONE, epoch} applied (revision + 1, claim cleared);
-- {REPLY_DONE_BEFORE, epoch} this write applied already; {REPLY_REFUSED, ms_left}
-- fenced out while token's lease is live (ms_left: how long it still runs; the limits
-- note: it keeps its limiter place), {REPLY_REFUSED} fenced out and token holds no live
-- lease of the task; {REPLY_RESEND_HISTORY}; {REPLY_SHRINK}.
local id, token, expected, cycle = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local status, term, body, ttl_ms, delay_ms = ARGV[5], ARGV[6], ARGV[7], tonumber(ARGV[8]), tonumber(ARGV[9])

local h = redis.call('HMGET', KEYS[1], 'rev', 'token', 'claimed', 'applied', 'epoch')
if h[1] and not int_in(h[1], 0, MAX_REVISION) then return corrupt(1, 'rev') end
if not h[1] or tonumber(h[1]) ~= expected or h[2] ~= token or h[3] ~= cycle then
  return refused(KEYS, h[1], h[4], h[5], id, token)
end
local out = apply_fenced(KEYS, ARGV, 12, id, expected, cycle, status, term, body, h[5], h[4], nil, ttl_ms, delay_ms,
  ARGV[10], ARGV[11])
if out[1] == REPLY_DONE then count(KEYS[9], 'commits') end
return out
