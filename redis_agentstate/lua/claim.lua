-- claim.lua: claim cycle N of a task under a lease computed on the server clock.
--   KEYS[1..7] - the task's keys (see _common.lua)
--   ARGV[1]    - token: the claim token (non-empty)
--   ARGV[2]    - cycle_index: N to claim (the checkpoint must be at N - 1)
--   ARGV[3]    - lease_ms: lease duration in ms
--   ARGV[4]    - have_epoch: cached history epoch (as load.lua)
--   ARGV[5]    - have_m: cached messages
--   ARGV[6]    - have_c: cached cycle records
-- Returns {REPLY_REFUSED} missing; {REPLY_TERMINAL, status};
-- {REPLY_NOT_RUNNING, status}; {REPLY_CYCLE_CONFLICT, found_cycle};
-- {REPLY_HELD, lease_expires_at_ms} claimed by another live token;
-- {REPLY_REVISION_EXHAUSTED, rev} the revision is too high for this claim's
-- commit to be stored (MAX_CLAIM_FROM_REV); {REPLY_DONE, checkpoint...}
-- claimed (revision bumped); {REPLY_DONE_BEFORE, checkpoint...} this token
-- already holds this cycle (a re-sent claim);
-- an AGENTSTATE_CORRUPT error reply when the hash holds a field this library
-- would not have written (nothing is written then).
local token, cycle_arg, lease_ms = ARGV[1], ARGV[2], tonumber(ARGV[3])
local epoch, have_m, have_c = ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6])
local cycle = tonumber(cycle_arg)

local h = redis.call('HMGET', KEYS[1], unpack(HASH_FIELDS))
if not present(h) then return {REPLY_REFUSED} end
local bad = bad_field(h)
if bad then return corrupt(1, bad) end
local status, current_cycle, rev = h[1], tonumber(h[2]), tonumber(h[3])
local held_by, claimed, lease = h[4], h[5], tonumber(h[6]) or 0

if is_terminal(status, h[7]) then return {REPLY_TERMINAL, status} end
if status ~= 'running' then return {REPLY_NOT_RUNNING, status} end
if current_cycle ~= cycle - 1 then return {REPLY_CYCLE_CONFLICT, h[2]} end

local now = server_now_ms()
if held_by ~= '' and lease > now then
  if held_by ~= token or claimed ~= cycle_arg then return {REPLY_HELD, h[6]} end
  local out = read_checkpoint(KEYS, epoch, have_m, have_c, h)
  table.insert(out, 1, REPLY_DONE_BEFORE)
  return out
end
if rev > MAX_CLAIM_FROM_REV then return {REPLY_REVISION_EXHAUSTED, h[3]} end
-- Read before writing: a history list of another Redis type fails here,
-- with nothing written (and the index is written before the hash).
local out = read_checkpoint(KEYS, epoch, have_m, have_c, h)
local expires = now + lease_ms
redis.call('ZADD', KEYS[4], expires, task_id_of(KEYS[1]))
redis.call('HSET', KEYS[1], 'rev', fmt(rev + 1), 'token', token,
  'claimed', cycle_arg, 'lease', fmt(expires))
out[3], out[4], out[5], out[6] = fmt(rev + 1), token, cycle_arg, fmt(expires)
table.insert(out, 1, REPLY_DONE)
return out
