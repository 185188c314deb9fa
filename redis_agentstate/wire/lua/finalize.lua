-- finalize.lua: write a terminal checkpoint; only when nobody holds a claim.
--   KEYS[1..7] - the task's keys (see _common.lua)
--   KEYS[8]    - the shard's parked index (see _common.lua): a parked task
--                (nobody holds it) may be finalized, and leaves it
--   KEYS[9]    - the shard's counters (see _common.lua): not written, sent for the common layout
--   KEYS[10]   - the task's step results (see _common.lua): dropped by a finalize applied now
--   ARGV[1]    - identity: of this write, a digest of its content (a re-send returns REPLY_DONE_BEFORE)
--   ARGV[2]    - expected_revision
--   ARGV[3]    - cycle_index
--   ARGV[4]    - status
--   ARGV[5]    - term: '1' (the body carries a terminal_result)
--   ARGV[6]    - body: blob (as create.lua)
--   ARGV[7]    - ttl_ms: the store's terminal_ttl_ms, 0 for none: the task expires that
--                long after this write unless acknowledged (expire_terminal in _common.lua)
--   ARGV[8]    - replace: '1' to replace the whole history, '0' to append
--   ARGV[9]    - epoch: the history epoch the client believes current ('' if unknown)
--   ARGV[10]   - base_m: messages the client knows are stored; -1 = full lists sent
--   ARGV[11]   - base_c: the same for cycle records
--   ARGV[12]   - n_messages: number of message blobs
--   ARGV[13..] - blobs: the new message blobs, then the new cycle blobs
-- Returns {REPLY_DONE, epoch} applied (revision + 1); {REPLY_DONE_BEFORE, epoch}
-- this write applied already; {REPLY_REFUSED} missing, wrong revision, claimed,
-- or already terminal, and {REPLY_REFUSED, ms_left, token} when a live claim is held
-- (its token, and how long its lease still runs: a holder that sent its own claimed
-- checkpoint keeps its limiter place, the limits note); {REPLY_RESEND_HISTORY}; {REPLY_SHRINK}.
local id, expected, cycle = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local status, term, body, ttl_ms = ARGV[4], ARGV[5], ARGV[6], tonumber(ARGV[7])

local h = redis.call('HMGET', KEYS[1], 'rev', 'token', 'term', 'applied', 'epoch')
if h[1] and not int_in(h[1], 0, MAX_REVISION) then return corrupt(1, 'rev') end
if not h[1] or tonumber(h[1]) ~= expected or h[2] ~= '' or h[3] == '1' then
  local out = refused(KEYS, h[1], h[4], h[5], id)
  local left = out[1] == REPLY_REFUSED and lease_left(KEYS, h[2])
  if left then return {REPLY_REFUSED, fmt(left), h[2]} end
  return out
end
return apply_fenced(KEYS, ARGV, 8, id, expected, cycle, status, term, body, h[5], h[4], nil, ttl_ms)
