-- claim_next.lua: claim the next cycle of a candidate task picked from its
-- shard's ready index, checking that the index entry is still due.
--   KEYS[1..7] - the candidate task's keys (see _common.lua); KEYS[4] is the
--                ready index of its shard, so every key is declared and in
--                the shard's slot
--   KEYS[8]    - the shard's parked index (see _common.lua)
--   KEYS[9]    - the shard's counters (see _common.lua): counts a fresh claim (and a takeover)
--   ARGV[1]    - token: the claim token (non-empty)
--   ARGV[2]    - lease_ms: lease duration in ms
--   ARGV[3]    - have_epoch: cached history epoch (as load.lua)
--   ARGV[4]    - have_m: cached messages
--   ARGV[5]    - have_c: cached cycle records
--   ARGV[6]    - max_attempts: the store's limit of attempts per cycle (0: none)
--   ARGV[7]    - permit_key: the concurrency key of the place taken for this claim ('' for none)
--   ARGV[8]    - permit_cap: that place's expiry, server ms (0 for none; the limits note in _common.lua)
--   ARGV[9]    - defer_until: 0, or (with permit_key, no place: the key is full) the ms until which
--                a candidate of that key is put off: its ready entry is moved there, and the
--                answer is a lost race (the limiter wakes it sooner when a place frees: core/limits.py)
--
-- The client picks the candidate with one pipelined peek at the head of each
-- shard's ready index (ZRANGE 0 0, the oldest score: FIFO). Between the peek
-- and this script another worker may have claimed it; then nothing is
-- written and the shard's current head is returned so the client can try it.
-- An index entry that disagrees with the checkpoint hash (which the other
-- scripts never leave behind) is repaired here, then treated as a lost race.
-- A candidate whose claim would be attempt max_attempts + 1 is parked here
-- (_common.lua) and answered as a lost race too (REPLY_PARKED in place of
-- REPLY_REFUSED): the caller goes on with the shard's head, and the parked
-- task costs no claim_next anything again.
--
-- Returns
--   {REPLY_DONE, checkpoint...}  claimed cycle_index + 1 (revision bumped, lease set)
--   {REPLY_TAKEN_OVER, checkpoint...}  the same, taken from another token whose
--                       lease had lapsed without a commit
--   {REPLY_DONE_BEFORE, checkpoint...}  this token already holds it with a
--                       live lease (a re-sent claim_next after a lost reply)
--   {REPLY_REFUSED, now}  not due any more; the shard has nothing else due
--   {REPLY_REFUSED, now, head_id, head_score}  not due any more; the shard's head now
--   {REPLY_LIMITED, now, key}  claimable, but it has concurrency key ``key`` and no permit came:
--                       nothing written (the caller takes a place and sends it again, or defers it)
--   {REPLY_PARKED, now[, head_id, head_score]}  parked now (its claim would have
--                       been attempt max_attempts + 1); as REFUSED otherwise
--   an AGENTSTATE_CORRUPT error reply: the hash holds a field this library
--   would not have written (nothing is written)
local token, lease_ms = ARGV[1], tonumber(ARGV[2])
local epoch, have_m, have_c = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local max_attempts = tonumber(ARGV[6])
local permit_key, permit_cap, defer_until = ARGV[7], ARGV[8], tonumber(ARGV[9])
local task_id = task_id_of(KEYS[1])
local now = server_now_ms()

local function lost_race()
  local head = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
  if head[1] then return {REPLY_REFUSED, fmt(now), head[1], head[2]} end
  return {REPLY_REFUSED, fmt(now)}
end

local h = redis.call('HMGET', KEYS[1], unpack(HASH_FIELDS))
local score = redis.call('ZSCORE', KEYS[4], task_id)

if not present(h) then
  -- No checkpoint: an index entry would be stale.
  if score then redis.call('ZREM', KEYS[4], task_id) end
  return lost_race()
end
local bad = bad_field(h)
if bad then return corrupt(1, bad) end

local status, cycle, rev = h[1], tonumber(h[2]), tonumber(h[3])
local held_by, claimed, lease = h[4], h[5], tonumber(h[6]) or 0
local next_cycle = cycle + 1

-- A re-send of a claim_next whose reply was lost: the claim is ours already.
if held_by == token and lease > now and claimed == fmt(next_cycle) then
  local out = read_checkpoint(KEYS, epoch, have_m, have_c, h)
  table.insert(out, 1, REPLY_DONE_BEFORE)
  return out
end

if is_terminal(status, h[7]) or not schedulable(status, h[14]) or h[11] == '1' or next_cycle > MAX_CYCLE then
  -- Not claimable at all: it must not be in the index.
  if score then redis.call('ZREM', KEYS[4], task_id) end
  return lost_race()
end

if rev > MAX_CLAIM_FROM_REV then
  -- Its commit could not be stored (see _common.lua): not claimable either.
  if score then redis.call('ZREM', KEYS[4], task_id) end
  return lost_race()
end

if held_by ~= '' and lease > now then
  -- Live claim (someone won the race): the index must say when it expires.
  local want = ready_score(h[15], lease)
  if not score or tonumber(score) ~= want then redis.call('ZADD', KEYS[4], fmt(want), task_id) end
  return lost_race()
end

local due = tonumber(h[14] or '')
if due and due > now then
  -- Delayed (or waiting before its deadline): the index must say when it falls due.
  local want = ready_score(h[15], due)
  if not score or tonumber(score) ~= want then redis.call('ZADD', KEYS[4], fmt(want), task_id) end
  return lost_race()
end

-- The checkpoint says claimable; that decides, whatever the index said. A limited one needs a
-- place in its key's limiter first (the limits note in _common.lua).
local expires = permitted_expiry(h[16], permit_key, permit_cap, now, lease_ms)
if not expires then
  if defer_until > now and permit_key == h[16] then
    redis.call('ZADD', KEYS[4], fmt(ready_score(h[15], defer_until)), task_id)
    return lost_race()
  end
  return {REPLY_LIMITED, fmt(now), h[16]}
end
local att, why, code = tonumber(h[10]) or 0, h[12] or '', REPLY_DONE
local fresh, lapsed = held_by ~= token or claimed ~= fmt(next_cycle), nil
if fresh then
  -- A fresh claim: a new attempt at this cycle (as claim_cycle in _common.lua);
  -- one that finds the attempt before it lapsed is a takeover.
  lapsed = lapsed_reason(h)
  if lapsed then why, code = lapsed, REPLY_TAKEN_OVER end
  if max_attempts > 0 and att >= max_attempts then
    park(KEYS, rev, att, why, now)
    -- A lost race for the caller, told apart so that telemetry counts the parking.
    local out = lost_race()
    out[1] = REPLY_PARKED
    return out
  end
  att = att + 1
end
-- Everything is read before the first write, so a key of another Redis type
-- fails with nothing written.
local out = read_checkpoint(KEYS, epoch, have_m, have_c, h)
redis.call('ZADD', KEYS[5], 0, task_id)
redis.call('ZADD', KEYS[4], fmt(ready_score(h[15], expires)), task_id)
if fresh then
  count(KEYS[9], 'claims')
  if lapsed then count(KEYS[9], 'takeovers') end
end
if why == (h[12] or '') then
  redis.call('HSET', KEYS[1], 'rev', fmt(rev + 1), 'token', token,
    'claimed', fmt(next_cycle), 'lease', fmt(expires), 'att', fmt(att))
else
  redis.call('HSET', KEYS[1], 'rev', fmt(rev + 1), 'token', token,
    'claimed', fmt(next_cycle), 'lease', fmt(expires), 'att', fmt(att), 'why', why)
end
out[3], out[4], out[5], out[6], out[10], out[12] = fmt(rev + 1), token, fmt(next_cycle), fmt(expires), fmt(att), why
table.insert(out, 1, code)
return out
