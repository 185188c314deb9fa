-- cancel.lua: end a task at once (an operator's or the application's decision), whoever holds it.
--   KEYS[1..7] - the task's keys (see _common.lua)
--   KEYS[8]    - the shard's parked index (see _common.lua): a parked task leaves it
--   KEYS[9]    - the shard's counters (see _common.lua): a cancel applied now is counted ('cancels')
--   KEYS[10]   - the task's step results (see _common.lua): dropped (the task has no next attempt)
--   ARGV[1]    - nonce: of this call (a re-send after a lost reply returns REPLY_DONE_BEFORE)
--   ARGV[2]    - reason: kept in 'why' (Checkpoint.last_failure); never empty (the client fills it in)
--   ARGV[3]    - ttl_ms: the store's terminal_ttl_ms, 0 for none: the cancelled task expires as any
--                terminal one (expire_terminal in _common.lua)
-- The status becomes 'cancelled' (terminal: TERMINAL in the prelude), the claim is cleared and the
-- revision bumped, so the holder's next commit, commit_and_claim, renew or finalize is fenced out
-- with nothing written; the task leaves the ready and parked indexes and is never claimed again.
-- History, body and cycle are kept as they were. The cancel is announced on the shard's wake-up
-- channel (notify_cancel in _common.lua), so a holder hears of it before its next renewal.
-- Returns {REPLY_DONE, revision} cancelled now; {REPLY_DONE_BEFORE} this nonce cancelled it already;
-- {REPLY_REFUSED} no such task; {REPLY_TERMINAL, status} terminal already (nothing written);
-- an AGENTSTATE_CORRUPT error reply for a field this library would not write (nothing written).
local nonce, reason, ttl_ms = ARGV[1], ARGV[2], tonumber(ARGV[3])

local h, applied, early = nonce_decision(KEYS, nonce)
if early then return early end
if is_terminal(h[1], h[7]) then return {REPLY_TERMINAL, h[1]} end

local now = server_now_ms()
local task_id = task_id_of(KEYS[1])
local rev = tonumber(h[3]) + 1
local old_tomb
if ttl_ms > 0 then old_tomb = redis.call('GET', KEYS[7]) end
-- Every key written below was type-checked first: a failure writes nothing.
probe(4, 8)
redis.call('HLEN', KEYS[10])
redis.call('ZREM', KEYS[4], task_id)
redis.call('ZREM', KEYS[8], task_id)
local ring = ring_push(applied, nonce)
redis.call('HSET', KEYS[1], 'status', 'cancelled', 'rev', fmt(rev), 'token', '', 'claimed', '', 'lease', '',
  'parked', '', 'why', reason, 'failrev', '', 'applied', ring)
redis.call('DEL', KEYS[10])
if ttl_ms > 0 then expire_terminal(KEYS, ttl_ms, now, rev, ring, old_tomb) end
count(KEYS[9], 'cancels')
notify_cancel(KEYS[4], task_id)
return {REPLY_DONE, fmt(rev)}
