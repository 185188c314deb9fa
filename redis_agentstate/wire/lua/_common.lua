-- _common.lua: prelude prepended to every checkpoint script (see wire/scripts.py).
--
-- Checkpoint key layout (keys.py builds these; every script but summary.lua and
-- prune.lua takes the first seven, in this order, and they share one hash slot
-- through the shard hash tag; the scripts that can park or unpark a task take
-- the eighth too, and the scripts that count (claim, claim_next, commit,
-- commit_and_claim) take the eighth and the ninth: keys.TaskKeys.counted()):
--   KEYS[1] - ns:{ns#SS}:cp:<task>      hash  HASH_FIELDS (wire/scripts.py) and applied
--   KEYS[2] - ns:{ns#SS}:msgs:<task>    list  one blob per message
--   KEYS[3] - ns:{ns#SS}:cycles:<task>  list  one blob per cycle record
--   KEYS[4] - ns:{ns#SS}:ready          zset  claimable task ids -> ms claimable since
--   KEYS[5] - ns:{ns#SS}:tasks          zset  every task id of the shard (score 0)
--   KEYS[6] - ns:{ns#SS}:gen            counter for history epochs
--   KEYS[7] - ns:{ns#SS}:tomb:<task>    tombstone: the write ring of an acknowledged task
--                                         (or of an expiring terminal one, see expire_terminal)
--   KEYS[8] - ns:{ns#SS}:parked         zset  parked (poison) task ids of the shard (score 0, lex order)
--   KEYS[9] - ns:{ns#SS}:counters       hash  claims/commits/takeovers of the shard (see count)
--   KEYS[10] - ns:{ns#SS}:steps:<task>  hash  '<cycle>\0<name>' -> result blob of a durable step
--                                         (step_record.lua); taken by the scripts that end a
--                                         cycle or the task (commit, commit_and_claim, finalize,
--                                         acknowledge_terminal, delete, save: TaskKeys.stepped()),
--                                         which drop it: a cycle's results never outlive it
--
-- Hash fields hold decimal strings; absent optional values are ''. 'term' is
-- '1' when a terminal_result is stored. 'epoch' names the current history
-- (it changes whenever history is rewritten, never when it is appended to),
-- so a client cache of history entries is valid while the epoch matches.
-- 'applied' holds the identities of the task's last writes, newest first, as
-- ' n1 n2 ... ' (at most APPLIED_MAX bytes, about 25 writes): a write re-sent
-- after a lost reply is recognised even when other workers have claimed and
-- written since. A commit or finalize is named by a digest of its content
-- (the client computes it: same write, same identity, whoever sends it), an
-- acknowledge_terminal by 'ack:<revision>', a create or save by a per-call
-- nonce. The fenced scripts consult the ring only when the fence refuses: a
-- write that passes the fence has not applied at this revision (applying
-- moves the revision on), even if an identical one did before a save or a
-- re-create brought the revision back.
--
-- Attempts and parking (poison tasks). 'att' counts the claims of the current
-- cycle: every fresh claim of cycle N (claim, claim_next, the claim of
-- commit_and_claim) adds one; a claim re-sent by the token that holds (or
-- held, its lease lapsed with nobody else claiming) that very cycle does not;
-- a commit or finalize (the cycle moved on) resets it. Counting at the claim
-- is what makes a SIGKILLed worker's attempt count: nothing runs when a
-- worker dies, but the next claim of that cycle finds the previous one
-- ended without a commit. A release without a reason (a shutdown handing the
-- cycle back) gives its attempt back; a release with a reason records it in
-- 'why' (and 'failrev', the claim's revision, so the next claim can tell a
-- released attempt from a lapsed one, whose 'why' it writes itself). With
-- max_attempts M (ARGV of the claiming scripts and release.lua; 0 = off),
-- the claim that would be attempt M + 1, or the release of attempt M with a
-- reason, parks the task instead: 'parked' = '1', the claim cleared and the
-- revision bumped (a late commit of the lapsed holder is fenced out, as a
-- takeover would fence it), out of the ready index, into the parked index
-- KEYS[8]. The status stays what it was (running): parking is not a
-- lifecycle state but a hold on one, and requeue.lua restores it exactly.

local CHUNK = 1000

-- No cycle of a task can ever be claimed again (models.Checkpoint.is_terminal;
-- TERMINAL is rendered from models.TERMINAL_STATUSES).
local function is_terminal(status, term)
  return term == '1' or TERMINAL[status] == true
end

local function task_id_of(checkpoint_key)
  return id_after(checkpoint_key, '}:cp:')
end

-- The write ring ('applied'): the identities of the task's last writes.
local APPLIED_MAX = 840

local function ring_has(applied, id)
  return applied and string.find(applied, ' ' .. id .. ' ', 1, true) ~= nil
end

-- ``applied`` with ``id`` pushed in front, the oldest identities dropped past APPLIED_MAX bytes.
-- The cut is found by stepping back from APPLIED_MAX to the nearest space (at most one
-- identity's length): a pattern match over the whole ring cost 4 us per write.
local function ring_push(applied, id)
  local ring = ' ' .. id .. (applied or ' ')
  if #ring > APPLIED_MAX then
    local cut = APPLIED_MAX
    while string.byte(ring, cut) ~= 32 do cut = cut - 1 end
    ring = string.sub(ring, 1, cut)
  end
  return ring
end

-- ---- data this library did not write ------------------------------------
-- Checked before a script writes anything. A malformed field gets the error
-- reply corrupt(<KEYS index>, <field>) (_base.lua); a key of another Redis
-- type fails a probe with WRONGTYPE. The client turns either into a
-- CorruptState naming the key and the task (wire/). Written for speed
-- (no tables or closures built per call): every claim runs it.

-- The number ``v`` holds if it is one this library wrote: decimal digits
-- only, in range. tonumber() alone takes '1e400', '-5', '2.5', ' 7', '0x10'.
local function int_in(v, lo, hi)
  if not v or #v > 16 or not string.find(v, '^%d+$') then return nil end
  local n = tonumber(v)
  if n < lo or n > hi then return nil end
  return n
end

-- ---- priorities ---------------------------------------------------------------
-- 'prio' (HASH_FIELDS 15: a decimal from MIN_PRIORITY to MAX_PRIORITY, '' for 0) is written by
-- create, save, commit and commit_and_claim. Every ready-index entry of the task is scored
-- ready_score(prio, at) = at - prio * PRIORITY_BAND: a band of about 70 years per priority,
-- so the index sorts by priority (higher first), then by time, and a reader tells an entry's
-- priority and time apart from its score alone (core/claim_next.py). Priority 0 scores are the
-- plain times, as before priorities existed.

-- The priority ``v`` (the stored string) holds, or nil when it is not one this library writes.
local function priority_of(v)
  if v == nil or v == '' then return MIN_PRIORITY end
  if #v ~= 1 or not string.find(v, '^%d$') then return nil end
  local p = tonumber(v)
  if p < MIN_PRIORITY or p > MAX_PRIORITY then return nil end
  return p
end

-- The ready score of a task of priority ``prio`` (the stored string) claimable at ``at`` (ms).
local function ready_score(prio, at)
  return at - (priority_of(prio) or MIN_PRIORITY) * PRIORITY_BAND
end

-- ---- per-key concurrency limits ------------------------------------------------
-- 'ckey' (HASH_FIELDS 16: the task's concurrency key, '' for none) is written by create, save,
-- commit and commit_and_claim. A task with one is limited: its key's limiter (keys.LimiterKeys:
-- another slot, so no script here can read it) holds one place per live lease, and a claim or a
-- renewal of the task is made only with a place in hand, its *permit*: the key and the place's
-- expiry (limiter clock, LIMIT_SKEW after the lease it was taken for). The script checks the
-- permit names the task's key and has not run out, and caps the lease at the place's expiry
-- minus LIMIT_SKEW, so a lease never outlives its place: a client that died between taking
-- the place and claiming leaks it for one lease at most, and a place whose lease lapsed frees
-- itself. Without a permit the answer is {REPLY_LIMITED, ...key} and nothing is written
-- (core/limits.py then takes a place and sends the claim again). An unlimited task pays one field.

-- The expiry (ms) of a lease of ``lease_ms`` from ``now`` for a task whose 'ckey' is ``ckey``,
-- under the permit (``permit_key``, ``permit_cap``: the place's expiry): nil when it needs a
-- permit it was not given (none, another key's, or run out).
local function permitted_expiry(ckey, permit_key, permit_cap, now, lease_ms)
  if ckey == nil or ckey == '' then return now + lease_ms end
  if permit_key ~= ckey then return nil end
  local cap = (tonumber(permit_cap) or 0) - LIMIT_SKEW
  if cap <= now then return nil end
  return math.min(now + lease_ms, cap)
end

-- 'att' and 'parked' (HASH_FIELDS 10 and 11), absent in data written before
-- attempts were counted: the first one this library would not have written, or nil.
local function bad_parking(att, parked)
  if att and att ~= '' and not int_in(att, 0, MAX_REVISION) then return 'att' end
  if parked and parked ~= '' and parked ~= '1' then return 'parked' end
  return nil
end

-- The first field of a HASH_FIELDS reply ``h`` this library would not have
-- written, or nil. status, cycle and rev are always there; '' marks absent
-- optional numbers.
local function bad_field(h)
  if not STATUSES[h[1]] then return 'status' end
  if not int_in(h[2], 0, MAX_CYCLE) then return 'cycle' end
  if not int_in(h[3], 0, MAX_REVISION) then return 'rev' end
  if h[5] and h[5] ~= '' and not int_in(h[5], 1, MAX_CYCLE) then return 'claimed' end
  if h[6] and h[6] ~= '' and not int_in(h[6], 0, MAX_REVISION) then return 'lease' end
  if h[7] and h[7] ~= '0' and h[7] ~= '1' then return 'term' end
  if h[14] and h[14] ~= '' and not int_in(h[14], 0, MAX_REVISION) then return 'due' end
  if h[15] and h[15] ~= '' and not priority_of(h[15]) then return 'prio' end
  if h[16] and #h[16] > MAX_CKEY_BYTES then return 'ckey' end
  return bad_parking(h[10], h[11])
end

-- True if the HMGET reply ``h`` found anything (the checkpoint exists).
local function present(h)
  for i = 1, #h do
    if h[i] then return true end
  end
  return false
end

-- The Redis type of each of KEYS[1..8] (see the layout above).
local KEY_TYPES = { 'hash', 'list', 'list', 'zset', 'zset', 'string', 'string', 'zset' }

-- Fails with WRONGTYPE if one of KEYS[i...] holds another type than ours:
-- called before a script's first write, for the keys it has not read yet.
-- (KEYS[1] needs none: every script reads it first.)
local function probe(...)
  local idx = { ... }
  for j = 1, #idx do
    local i = idx[j]
    if KEY_TYPES[i] == 'list' then
      redis.call('LLEN', KEYS[i])
    elseif KEY_TYPES[i] == 'zset' then
      redis.call('ZCARD', KEYS[i])
    else
      redis.call('GET', KEYS[i])
    end
  end
end

-- ---- decisions named by a per-call nonce (cancel, resume) ------------------

-- The opening of a script that decides a task's fate by itself (not fenced by a claim) and is
-- named by its call's nonce: the task's HASH_FIELDS and write ring, or (nil, nil, reply) with the
-- reply to give at once: {REPLY_DONE_BEFORE} when this very call applied already (the hash's
-- ring, or the tombstone's when the task was acknowledged since), {REPLY_REFUSED} when there is
-- no task, corrupt() for a field this library would not write. Nothing is written.
local function nonce_decision(keys, nonce)
  local h = redis.call('HMGET', keys[1], unpack(HASH_FIELDS))
  if not present(h) then
    if ring_has(redis.call('GET', keys[7]), nonce) then return nil, nil, {REPLY_DONE_BEFORE} end
    return nil, nil, {REPLY_REFUSED}
  end
  local bad = bad_field(h)
  if bad then return nil, nil, corrupt(1, bad) end
  local applied = redis.call('HGET', keys[1], 'applied')
  if ring_has(applied, nonce) then return nil, nil, {REPLY_DONE_BEFORE} end
  return h, applied, nil
end

-- ---- wake-ups of blocked claim_next callers (wire/waker.py) ---------------------
-- Every script that makes a task claimable now, or sooner than its ready
-- score said, calls notify_due once it passed its checks: an SPUBLISH on the
-- shard's channel ns:{ns#SS}:due (keys.Keys.shard_due: the ready key with
-- 'due' for 'ready', so it hashes to the shard's slot), payload
-- '<ms until the task is due> <task id>' ('0 ...': now; the id lets a woken
-- caller claim it in one script, without a peek). A sharded channel stays on the slot's primary
-- on Redis Cluster (a plain PUBLISH is broadcast to every node), and costs
-- about a microsecond with nobody subscribed. redis.pcall: a user whose ACL
-- lacks the channel still writes; its blocked callers then find the work at
-- their next timer or block_ms instead (see README, "Least privilege").
-- A lease that lapses is not an event: waiters time themselves from the
-- earliest ready score their last claim attempt saw.
local function notify_due(ready_key, delay_ms, task_id)
  redis.pcall('SPUBLISH', string.sub(ready_key, 1, -6) .. 'due', fmt(delay_ms) .. ' ' .. task_id)
end

-- A cancel (cancel.lua) is announced on the same channel, payload 'cancel <task id>': a
-- lease that holds the task (its store's subscriber is up while it holds one, wire/waker.py)
-- renews at once, and the renewal's refusal tells it the task was cancelled and why. The
-- message is only a hint (nothing is trusted from it): a lease that misses it learns the
-- same at its next renewal. A subscriber that does not know the word wakes one blocked
-- caller for nothing, which re-checks and sleeps again.
local function notify_cancel(ready_key, task_id)
  redis.pcall('SPUBLISH', string.sub(ready_key, 1, -6) .. 'due', 'cancel ' .. task_id)
end

-- ---- timers: delayed cycles and waiting deadlines ---------------------------
-- 'due' (HASH_FIELDS 14, server ms, '' for none) is written by every write that
-- sets the next cycle's terms (create, save, commit and the other fenced writes,
-- resume): now + delay_ms, or ''. A running task is claimable once 'due' has
-- passed: claim answers REPLY_NOT_DUE before, and the ready index scores it
-- 'due', so claim_next does not meet it earlier and blocked callers time
-- themselves by it (the same timer as a lapsing lease: one mechanism). A task
-- in 'wait_user' with a 'due' is waiting with a deadline: at 'due' its next
-- cycle becomes claimable by itself, status still 'wait_user' (so the handler
-- tells a timeout from a resume, which sets 'running'); without one it waits
-- for resume.lua and is in no ready index. A claim leaves 'due' as it was (a
-- lapsed claim of a timed-out wait is claimable again); the write that ends the
-- cycle sets it anew.

-- Whether status ``status`` with due time ``due`` (the stored string) can have a
-- cycle claimed at some time: running, or waiting with a deadline.
local function schedulable(status, due)
  return status == 'running' or (status == WAIT_USER and due ~= nil and due ~= '')
end

-- Keep the shard indexes in step with the hash (same slot, same script).
-- ``due``: the hash's 'due' as written ('' or nil for none); ``prio``: its 'prio'.
local function reindex(ready_key, tasks_key, task_id, status, term, token, lease, now, due, prio)
  redis.call('ZADD', tasks_key, 0, task_id)
  if schedulable(status, due) and not is_terminal(status, term) then
    local at = now
    if token ~= '' then
      at = tonumber(lease) or now
    elseif due and due ~= '' then
      at = math.max(now, tonumber(due))
    end
    redis.call('ZADD', ready_key, fmt(ready_score(prio, at)), task_id)
    -- Unclaimed: due at ``at`` (now, or later: the waiters' timers). A claimed one is due when its
    -- lease lapses: no event.
    if token == '' then notify_due(ready_key, at - now, task_id) end
  else
    redis.call('ZREM', ready_key, task_id)
  end
end

local function push_range(key, list, first, last)
  local i = first
  while i <= last do
    local j = math.min(i + CHUNK - 1, last)
    redis.call('RPUSH', key, unpack(list, i, j))
    i = j + 1
  end
end

-- The full checkpoint as a flat array (nil-free, for RESP2 and RESP3 alike):
--   status cycle rev token claimed lease term body epoch att parked why failrev
--   n_msgs n_cycles from_msgs from_cycles k <k messages> <cycle records>
-- History is sent from the caller's cached position when its epoch matches.
-- ``h`` may be passed when the caller already read (and updated) those fields
-- (HASH_FIELDS is rendered from scripts.HASH_FIELDS).
local function read_checkpoint(keys, epoch, have_m, have_c, h)
  h = h or redis.call('HMGET', keys[1], unpack(HASH_FIELDS))
  local nm = redis.call('LLEN', keys[2])
  local nc = redis.call('LLEN', keys[3])
  local from_m, from_c = 0, 0
  if h[9] and h[9] == epoch and have_m <= nm and have_c <= nc then
    from_m, from_c = have_m, have_c
  end
  local out = {}
  local nf = #HASH_FIELDS
  for i = 1, nf do out[i] = h[i] or '' end
  local msgs = {}
  if from_m < nm then msgs = redis.call('LRANGE', keys[2], from_m, -1) end
  local cycles = {}
  if from_c < nc then cycles = redis.call('LRANGE', keys[3], from_c, -1) end
  out[nf + 1] = fmt(nm)
  out[nf + 2] = fmt(nc)
  out[nf + 3] = fmt(from_m)
  out[nf + 4] = fmt(from_c)
  out[nf + 5] = fmt(#msgs)
  local n = nf + 5
  for i = 1, #msgs do n = n + 1; out[n] = msgs[i] end
  for i = 1, #cycles do n = n + 1; out[n] = cycles[i] end
  return out
end

-- Writes the history part of a write operation (create, save, commit, finalize):
--   current_epoch - the epoch stored ('' for a new task: the history is replaced)
--   now           - server ms: makes a new epoch unique even if the shard counter
--                   was lost (FLUSHALL, restart without persistence) while a
--                   client cache survived
--   replace       - '1' to replace the whole history, '0' to append
--   epoch         - the epoch the client believes current ('' if unknown)
--   base_m        - messages the client knows are stored; -1 = full list sent
--   base_c        - the same for cycle records
--   blobs, first, n_m - blobs[first .. first + n_m - 1] are the message blobs,
--                   blobs[first + n_m .. #blobs] the cycle blobs
--   index         - nil, or a function that writes the shard indexes (KEYS[4], KEYS[5]):
--                   called once every check has passed and before the history's
--                   first write, so an index of another Redis type fails it with
--                   nothing written and needs no probe (two commands fewer)
-- Returns the epoch now current, or nil plus an error code:
--   'resend' - the client's base does not match what is stored (send full lists)
--   'shrink' - a full list shorter than what is stored, without replace
-- Nothing is written when it returns an error code.
-- write_history's refusal: an index of another Redis type is still reported first
-- (as the probe did before ``index`` replaced it), with nothing written.
local function refuse_history(index, why)
  if index then probe(4, 5) end
  return nil, why
end

local function write_history(keys, current_epoch, now, replace, epoch, base_m, base_c, blobs, first, n_m, index)
  local first_m, last_m = first, first + n_m - 1
  local first_c, last_c = last_m + 1, #blobs
  if replace == '1' or current_epoch == '' then
    probe(2, 3)
    -- gen is the whole shard's: a value INCR refuses (an operator's SET) would fail every
    -- task's rewrite after its first write. It is restarted from the clock, above any
    -- count INCR reaches, so the epochs it names stay new (read here: WRONGTYPE before any write).
    local gen = redis.call('GET', keys[6])
    local restart = gen and not int_in(gen, 0, MAX_REVISION)
    -- The first write of every caller: without ``index`` the caller's reindex() comes last.
    if index then index() else probe(4, 5) end
    redis.call('DEL', keys[2], keys[3])
    push_range(keys[2], blobs, first_m, last_m)
    push_range(keys[3], blobs, first_c, last_c)
    if restart then redis.call('SET', keys[6], fmt(now)) end
    return fmt(redis.call('INCR', keys[6])) .. '.' .. fmt(now)
  end
  local nm = redis.call('LLEN', keys[2])
  local nc = redis.call('LLEN', keys[3])
  if base_m < 0 then
    -- Full lists sent: skip what is already stored.
    if n_m < nm or (last_c - first_c + 1) < nc then return refuse_history(index, 'shrink') end
    first_m = first_m + nm
    first_c = first_c + nc
  elseif epoch ~= current_epoch or base_m ~= nm or base_c ~= nc then
    return refuse_history(index, 'resend')
  end
  -- The lists were type-checked by LLEN; this is the first write.
  if index then index() else probe(4, 5) end
  push_range(keys[2], blobs, first_m, last_m)
  push_range(keys[3], blobs, first_c, last_c)
  return current_epoch
end

-- ---- a refused holder and its limiter place (the limits note) ------------------
-- A refused fenced write or renewal says whether the lease it was sent for goes on: a write that
-- was only stale (a wrong revision or cycle, a claim still held) must not give back the limiter
-- place of a lease that is still live, and one whose lease is over (taken over, lapsed, the task
-- gone or terminal) gives it back at once (core/limits.py). Read only on the refusal path.

-- How long (ms, above 0) ``token``'s lease of the task whose hash is keys[1] still runs, or nil
-- when ``token`` holds no live lease of it.
local function lease_left(keys, token)
  if not token or token == '' then return nil end
  local h = redis.call('HMGET', keys[1], 'token', 'lease')
  if h[1] ~= token then return nil end
  local lease = int_in(h[2], 0, MAX_REVISION)
  if not lease then return nil end
  local left = lease - server_now_ms()
  if left > 0 then return left end
  return nil
end

-- The refusal of a write or renewal sent with ``token``: {REPLY_REFUSED, ms_left} while that
-- lease is live (ms_left: how long it still runs), {REPLY_REFUSED} when it is not.
local function refused_to(keys, token)
  local left = lease_left(keys, token)
  if left then return {REPLY_REFUSED, fmt(left)} end
  return {REPLY_REFUSED}
end

-- ---- the fenced writes (commit, finalize) ---------------------------------

-- The reply of a fenced write whose fence refused it: REPLY_DONE_BEFORE if
-- this very write applied already, whatever happened since (other workers
-- claimed and wrote, or the task was acknowledged: deleted, the tombstone
-- keeps the ring; maybe even created again), else REPLY_REFUSED.
-- exists, applied, epoch: the hash's fields as read (exists false: no hash).
-- ``token`` (commit, commit_and_claim): the write's claim token; its REPLY_REFUSED then says
-- whether that lease is still live (refused_to below).
local function refused(keys, exists, applied, epoch, id, token)
  if exists and ring_has(applied, id) then return {REPLY_DONE_BEFORE, epoch} end
  if ring_has(redis.call('GET', keys[7]), id) then return {REPLY_DONE_BEFORE, ''} end
  if token then return refused_to(keys, token) end
  return {REPLY_REFUSED}
end

-- ---- retention of terminal tasks (CheckpointStore(terminal_ttl_ms=...)) ----

-- ``newer`` (a write ring) with the identities of ``older`` (a tombstone's ring, or
-- nil) after it, cut at APPLIED_MAX like any ring.
local function ring_join(newer, older)
  if not older or #older < 2 then return newer end
  local inner = string.sub(newer, 2, -2)
  if inner == '' then return older end
  return ring_push(older, inner)
end

-- A task that just became terminal at revision ``rev`` expires ``ttl_ms`` from
-- ``now`` unless acknowledged first: one PEXPIREAT per key, at one absolute
-- time, so a reader (a script sees time frozen at its start) finds all of the
-- task's keys or none. The tombstone KEYS[7] takes the task's write ring, its
-- own older identities and 'exp:<rev>', and outlives the task by min(ttl_ms,
-- TOMB_MS): a re-sent write is still recognised after the expiry, and an
-- acknowledgement of ``rev`` still answers done (acknowledge_terminal.lua).
-- The shard indexes are not touched: readers drop entries whose hash is gone
-- (prune.lua), so expiry costs no scan.
-- ``old_tomb`` is KEYS[7] as read before the write began (a tombstone of another
-- Redis type fails that read, with nothing written).
local function expire_terminal(keys, ttl_ms, now, rev, ring, old_tomb)
  local at = fmt(now + ttl_ms)
  redis.call('PEXPIREAT', keys[1], at)
  redis.call('PEXPIREAT', keys[2], at)
  redis.call('PEXPIREAT', keys[3], at)
  local tomb = ring_push(ring_join(ring, old_tomb), 'exp:' .. fmt(rev))
  redis.call('SET', keys[7], tomb, 'PX', fmt(ttl_ms + math.min(ttl_ms, TOMB_MS)))
end

-- ---- shard counters (agentstate stats --watch) -----------------------------
-- The scripts that claim or commit take the shard's counter hash as KEYS[9]
-- and count what they applied: 'claims' (fresh claims: the attempts of
-- _common.lua's note above, not a re-sent claim), 'commits' (a commit or the
-- commit of commit_and_claim applied now, not a re-send) and 'takeovers' (a
-- fresh claim that found the previous attempt lapsed: lapsed_reason, so a
-- cycle released and claimed by another worker is not one). A claim that
-- parks the task instead is none of them. Statistics must never fail a state
-- write, so the counter is written with pcall (a key of another type is
-- ignored); it is written after the script's checks and reads, so a script
-- that fails leaves no count behind.
local function count(counters_key, field)
  redis.pcall('HINCRBY', counters_key, field, 1)
end

-- Applies a fenced write that passed its fence: the indexes, its history, then
-- the hash (revision + 1, claim cleared, ``id`` pushed on the ring ``applied``). argv[at .. at + 4] are its history slots (replace, epoch,
-- base_m, base_c, n_messages: see commit.lua), the blobs follow.
-- ``claim`` (commit_and_claim.lua), if given, is {token, cycle, lease_ms}: the
-- same HSET then also claims that next cycle (revision + 2, lease from now, but not past
-- claim[4] when given: its permit's cap, the limits note),
-- and the reply carries the lease's expiry as a third entry.
-- ``ttl_ms`` (commit, finalize: their ttl_ms slot), if above 0: a write that
-- leaves the task terminal sets its expiry (expire_terminal). ``delay_ms``
-- (commit's delay_ms slot), if above 0: the next cycle is due that long from
-- now (the timers note), or a 'wait_user' write's deadline. ``prio`` (commit, commit_and_claim:
-- their priority slot), if given: the task's priority from now on (the priorities note); else
-- the stored one stays (finalize: a terminal task is in no ready index); ``ckey`` (given with
-- ``prio``) its concurrency key from now on ('' for none: the limits note).
local function apply_fenced(keys, argv, at, id, expected, cycle, status, term, body, stored_epoch, applied, claim,
                            ttl_ms, delay_ms, prio, ckey)
  local now = server_now_ms()
  -- The next cycle's due time (the timers note above): '' unless delayed.
  local due = ''
  if delay_ms and delay_ms > 0 then due = fmt(now + delay_ms) end
  local rev, token, claimed, lease = expected + 1, '', '', ''
  if claim then
    rev, token, claimed, lease = expected + 2, claim[1], claim[2], fmt(math.min(now + claim[3], claim[4] or math.huge))
  end
  local expiring = ttl_ms and ttl_ms > 0 and is_terminal(status, term)
  local old_tomb
  if expiring then old_tomb = redis.call('GET', keys[7]) end
  -- The indexes are written first (see write_history), the hash last: every key
  -- was read or written before it, so nothing can fail half-way.
  local epoch, err = write_history(keys, stored_epoch, now, argv[at], argv[at + 1], tonumber(argv[at + 2]),
    tonumber(argv[at + 3]), argv, at + 5, tonumber(argv[at + 4]),
    function()
      -- A finalize may close a parked task (KEYS[8] given): it leaves the parked index
      -- first, so an index of another Redis type fails with nothing written. Only a
      -- terminal write can find the task parked: parking clears the claim, so the
      -- fence of a commit (a token) never passes on a parked task, and a commit that
      -- is not terminal, or commit_and_claim (KEYS[8] given too, for the layout),
      -- spends no command here.
      if keys[8] and is_terminal(status, term) then redis.call('ZREM', keys[8], task_id_of(keys[1])) end
      reindex(keys[4], keys[5], task_id_of(keys[1]), status, term, token, lease, now, due, prio)
    end)
  if not epoch then
    if err == 'resend' then return {REPLY_RESEND_HISTORY} end
    return {REPLY_SHRINK}
  end
  -- The cycle moved on: its attempts and failure are over (the next claim, if
  -- made here, is attempt 1 of the next cycle).
  local att = '0'
  if claim then att = '1' end
  local ring = ring_push(applied, id)
  redis.call('HSET', keys[1], 'status', status, 'cycle', cycle, 'rev', fmt(rev),
    'token', token, 'claimed', claimed, 'lease', lease, 'term', term, 'body', body,
    'epoch', epoch, 'applied', ring, 'att', att, 'parked', '', 'why', '', 'failrev', '', 'due', due)
  if prio then redis.call('HSET', keys[1], 'prio', prio, 'ckey', ckey) end
  if expiring then expire_terminal(keys, ttl_ms, now, rev, ring, old_tomb) end
  -- The cycle is written: its durable steps' results are over (DEL cannot fail half-way).
  if keys[10] then redis.call('DEL', keys[10]) end
  if claim then return {REPLY_DONE, epoch, lease} end
  return {REPLY_DONE, epoch}
end

-- ---- durable steps (step_load, step_record) --------------------------------

-- {REPLY_REFUSED} unless ``token`` holds cycle ``cycle`` (a decimal string) of the
-- task whose hash is ``keys[1]`` at revision ``expected``, with its lease live on
-- the server clock (renew.lua's rule); nil when it does. A malformed field gets
-- the corrupt() error reply.
local function lease_not_current(keys, token, expected, cycle)
  local h = redis.call('HMGET', keys[1], 'rev', 'token', 'claimed', 'lease')
  if not h[1] then return {REPLY_REFUSED} end
  if not int_in(h[1], 0, MAX_REVISION) then return corrupt(1, 'rev') end
  if h[4] and h[4] ~= '' and not int_in(h[4], 0, MAX_REVISION) then return corrupt(1, 'lease') end
  if tonumber(h[1]) ~= expected or h[2] ~= token or h[3] ~= cycle or (tonumber(h[4]) or 0) <= server_now_ms() then
    return {REPLY_REFUSED}
  end
  return nil
end

-- ---- the claim of one cycle (claim, commit_and_claim) ----------------------

-- The longest failure reason kept ('why'): a reason is for a human to read.
local WHY_MAX = 1024

-- Parks the task whose hash ``keys[1]`` is at revision ``rev`` (see the
-- attempts note above): the claim is cleared and the revision bumped, the task
-- leaves the ready index for the parked index ``keys[8]``. ``att`` attempts were
-- made, ``why`` was the last failure. Returns {REPLY_PARKED, att, why, '1'}:
-- the '1' tells parked now from a task found parked (telemetry counts parkings).
-- Every key it writes was type-checked first, so it fails with nothing written.
local function park(keys, rev, att, why, now)
  local task_id = task_id_of(keys[1])
  probe(4, 8)
  redis.call('ZREM', keys[4], task_id)
  redis.call('ZADD', keys[8], 0, task_id)
  redis.call('HSET', keys[1], 'rev', fmt(rev + 1), 'token', '', 'claimed', '', 'lease', '',
    'att', fmt(att), 'parked', '1', 'why', why)
  return {REPLY_PARKED, fmt(att), why, '1'}
end

-- What a fresh claim of a task whose HASH_FIELDS are ``h`` finds of the
-- attempt before it: the reason to record when that attempt lapsed (a claim
-- was held, its lease ran out, and no release recorded a failure for it), else nil.
local function lapsed_reason(h)
  if h[4] == '' or h[13] == h[3] then return nil end
  return string.sub('lease of ' .. h[4] .. ' on cycle ' .. h[5] ..
    ' expired without a commit (the worker died, stalled or was cut off)', 1, WHY_MAX)
end

-- Claims cycle ``cycle_arg`` (a decimal string) of the task for ``token`` under
-- a lease of ``lease_ms`` from now, on the server clock; epoch, have_m, have_c
-- are the caller's cached history (as load.lua); ``max_att`` the store's
-- max_attempts (0: off); ``permit_key``, ``permit_cap`` the claim's permit ('' and 0 for
-- none: the limits note). The reply is claim.lua's (its header lists it);
-- nothing is written unless it starts with REPLY_DONE, REPLY_TAKEN_OVER or
-- REPLY_PARKED. keys[9] is the shard's counter hash (see count): a fresh claim
-- is counted, and a takeover when the attempt before it lapsed.
local function claim_cycle(keys, token, cycle_arg, lease_ms, epoch, have_m, have_c, max_att, permit_key, permit_cap)
  local h = redis.call('HMGET', keys[1], unpack(HASH_FIELDS))
  if not present(h) then return {REPLY_REFUSED} end
  local bad = bad_field(h)
  if bad then return corrupt(1, bad) end
  local status, current_cycle, rev = h[1], tonumber(h[2]), tonumber(h[3])
  local held_by, claimed, lease = h[4], h[5], tonumber(h[6]) or 0

  if is_terminal(status, h[7]) then return {REPLY_TERMINAL, status} end
  if h[11] == '1' then return {REPLY_PARKED, h[10] or '0', h[12] or ''} end
  if not schedulable(status, h[14]) then return {REPLY_NOT_RUNNING, status} end
  if current_cycle ~= tonumber(cycle_arg) - 1 then return {REPLY_CYCLE_CONFLICT, h[2]} end

  local now = server_now_ms()
  if held_by ~= '' and lease > now then
    if held_by ~= token or claimed ~= cycle_arg then return {REPLY_HELD, h[6]} end
    local out = read_checkpoint(keys, epoch, have_m, have_c, h)
    table.insert(out, 1, REPLY_DONE_BEFORE)
    return out
  end
  local due = tonumber(h[14] or '')
  if due and due > now then
    -- A waiting task before its deadline waits for a person; a running one is delayed.
    if status ~= 'running' then return {REPLY_NOT_RUNNING, status} end
    return {REPLY_NOT_DUE, h[14]}
  end
  if rev > MAX_CLAIM_FROM_REV then return {REPLY_REVISION_EXHAUSTED, h[3]} end
  local expires = permitted_expiry(h[16], permit_key, permit_cap, now, lease_ms)
  if not expires then return {REPLY_LIMITED, h[16]} end
  local att, why, code = tonumber(h[10]) or 0, h[12] or '', REPLY_DONE
  local fresh, lapsed = held_by ~= token or claimed ~= cycle_arg, nil
  if fresh then
    -- A fresh claim: a new attempt at this cycle. One that finds the attempt
    -- before it lapsed (not released) is a takeover (counted, and answered
    -- REPLY_TAKEN_OVER for telemetry).
    lapsed = lapsed_reason(h)
    if lapsed then why, code = lapsed, REPLY_TAKEN_OVER end
    if max_att > 0 and att >= max_att then return park(keys, rev, att, why, now) end
    att = att + 1
  end
  -- Read before writing: a history list of another Redis type fails here,
  -- with nothing written (and the index is written before the hash).
  local out = read_checkpoint(keys, epoch, have_m, have_c, h)
  redis.call('ZADD', keys[4], fmt(ready_score(h[15], expires)), task_id_of(keys[1]))
  if fresh then
    count(keys[9], 'claims')
    if lapsed then count(keys[9], 'takeovers') end
  end
  if why == (h[12] or '') then
    redis.call('HSET', keys[1], 'rev', fmt(rev + 1), 'token', token,
      'claimed', cycle_arg, 'lease', fmt(expires), 'att', fmt(att))
  else
    redis.call('HSET', keys[1], 'rev', fmt(rev + 1), 'token', token,
      'claimed', cycle_arg, 'lease', fmt(expires), 'att', fmt(att), 'why', why)
  end
  out[3], out[4], out[5], out[6], out[10], out[12] = fmt(rev + 1), token, cycle_arg, fmt(expires), fmt(att), why
  table.insert(out, 1, code)
  return out
end
