-- commit_and_claim.lua: commit cycle N of a claimed task and claim N + 1 for
-- the same worker, in one script (a worker that goes on with the same task).
--   KEYS[1..7] - the task's keys (see _common.lua)
--   KEYS[8]    - the shard's parked index (see _common.lua)
--   KEYS[9]    - the shard's counters (see _common.lua): counts the commit and the claim
--                applied now (a re-send's claim only when it is a fresh one: claim_cycle)
--   KEYS[10]   - the task's step results (see _common.lua): dropped by a commit applied now
--   ARGV[1]    - identity: of this write, a digest of its content (as commit.lua)
--   ARGV[2]    - token: the claim token that holds cycle N
--   ARGV[3]    - expected_revision: the one the claim returned
--   ARGV[4]    - cycle_index: N, of the checkpoint (must equal the claimed cycle)
--   ARGV[5]    - status: 'running' (the client refuses any other before sending)
--   ARGV[6]    - term: '0' (no terminal_result: the task stays claimable)
--   ARGV[7]    - body: blob (as create.lua)
--   ARGV[8]    - next_token: the token that claims cycle N + 1
--   ARGV[9]    - lease_ms: the new claim's lease, from now on the server clock
--   ARGV[10]   - max_attempts: the store's limit of attempts per cycle (0: none)
--   ARGV[11]   - priority: the task's priority from now on (the priorities note in _common.lua)
--   ARGV[12]   - concurrency_key: the task's from now on ('' for none; the limits note in _common.lua)
--   ARGV[13]   - permit_cap: the expiry (server ms) of the place the client took in that key's
--                limiter for the new claim (0 for none)
--   ARGV[14]   - replace: '1' to replace the whole history, '0' to append
--   ARGV[15]   - epoch: the history epoch the client believes current ('' if unknown)
--   ARGV[16]   - base_m: messages the client knows are stored; -1 = full lists sent
--   ARGV[17]   - base_c: the same for cycle records
--   ARGV[18]   - n_messages: number of message blobs
--   ARGV[19..] - blobs: the new message blobs, then the new cycle blobs
-- The commit is commit.lua's (same fence, same write ring); the claim needs no
-- checks of its own when the fence passes: the status is running, nobody else
-- can hold the cycle the commit just closed, and the client checked the cycle
-- and revision limits (N + 1 <= MAX_CYCLE, expected + 1 <= MAX_CLAIM_FROM_REV).
-- The claim is attempt 1 of cycle N + 1 (the commit reset the count).
-- Returns
--   {REPLY_DONE, epoch, lease_expires_at_ms}  committed (revision + 1) and
--       claimed N + 1 (revision + 2): the client knows the history it wrote;
--   {REPLY_DONE, checkpoint...}  the same, when full lists were appended
--       (base_m = -1, replace = '0'): the client does not know what was kept,
--       so the claim comes back as claim.lua's does, history whole;
--   {REPLY_DONE_BEFORE, checkpoint...}  this write applied already (a re-send
--       after a lost reply) and next_token holds N + 1: the claim as claim.lua
--       returns it (its lease renewed only if it had lapsed and nobody took it);
--   {REPLY_REFUSED}  fenced out, nothing written ({REPLY_REFUSED, ms_left}: token's lease is
--       still live and runs ms_left more: it keeps its limiter place, the limits note);
--   {REPLY_LIMITED, key, ms_left}  the task goes on with concurrency key ``key`` and the new claim
--       came without a live place (permit_cap run out): nothing written (ms_left as above, absent
--       when token's lease is not live; {REPLY_LIMITED, key}: a re-send, below);
--   {REPLY_RESEND_HISTORY}; {REPLY_SHRINK} (as commit.lua);
--   {REPLY_TERMINAL, status}, {REPLY_NOT_RUNNING, status}, {REPLY_CYCLE_CONFLICT, cycle},
--   {REPLY_HELD, lease_expires_at_ms}, {REPLY_REVISION_EXHAUSTED, rev},
--       {REPLY_PARKED, attempts, reason[, '1']}  a re-send whose
--       commit applied already but whose claim can no longer be had (nothing written
--       now, but for '1': this claim parked the task, as claim.lua's would);
--       TERMINAL with status 'acknowledged' when the task was acknowledged since.
local id, token, expected, cycle = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local status, term, body = ARGV[5], ARGV[6], ARGV[7]
local next_token, lease_ms, max_attempts = ARGV[8], tonumber(ARGV[9]), tonumber(ARGV[10])
local ckey, permit_cap = ARGV[12], ARGV[13]
local next_cycle = fmt(tonumber(cycle) + 1)

local h = redis.call('HMGET', KEYS[1], 'rev', 'token', 'claimed', 'applied', 'epoch')
if h[1] and not int_in(h[1], 0, MAX_REVISION) then return corrupt(1, 'rev') end
if not h[1] or tonumber(h[1]) ~= expected or h[2] ~= token or h[3] ~= cycle then
  if h[1] and ring_has(h[4], id) then
    -- Applied already: hand back the claim that came with it (the cache the
    -- client had when it sent is what its history slots name).
    local epoch, have_m, have_c = ARGV[15], tonumber(ARGV[16]), tonumber(ARGV[17])
    if have_m < 0 then epoch, have_m, have_c = '', 0, 0 end
    local out = claim_cycle(KEYS, next_token, next_cycle, lease_ms, epoch, have_m, have_c, max_attempts, ckey,
      permit_cap)
    if out[1] == REPLY_DONE or out[1] == REPLY_TAKEN_OVER then out[1] = REPLY_DONE_BEFORE end
    return out
  end
  local out = refused(KEYS, h[1], h[4], h[5], id, token)
  if out[1] == REPLY_DONE_BEFORE then return {REPLY_TERMINAL, 'acknowledged'} end
  return out
end
-- The new claim's lease, capped by its permit (checked before anything is written).
local capped = permitted_expiry(ckey, ckey, permit_cap, server_now_ms(), lease_ms)
if not capped then
  local left = lease_left(KEYS, token)
  if left then return {REPLY_LIMITED, ckey, fmt(left)} end
  return {REPLY_LIMITED, ckey}
end
local cap = nil
if ckey ~= '' then cap = tonumber(permit_cap) - LIMIT_SKEW end
local out = apply_fenced(KEYS, ARGV, 14, id, expected, cycle, status, term, body, h[5], h[4],
  {next_token, next_cycle, lease_ms, cap}, nil, nil, ARGV[11], ckey)
if out[1] == REPLY_DONE then
  count(KEYS[9], 'commits')
  count(KEYS[9], 'claims')
end
if out[1] == REPLY_DONE and ARGV[14] ~= '1' and tonumber(ARGV[16]) < 0 then
  out = read_checkpoint(KEYS, '', 0, 0)
  table.insert(out, 1, REPLY_DONE)
end
return out
