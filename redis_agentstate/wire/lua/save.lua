-- save.lua: store a checkpoint unconditionally (admin / import), replacing
-- whatever the task held, history included.
--   KEYS[1..7] - the task's keys (see _common.lua)
--   KEYS[8]    - the shard's parked index (see _common.lua): a saved task is not parked
--   KEYS[9]    - the shard's counters (see _common.lua): not written, sent for the common layout
--   KEYS[10]   - the task's step results (see _common.lua): dropped, as the rest of what the
--                task held (a save that moves the task back must not replay another run's steps)
--   ARGV[1]    - nonce: of this call
--   ARGV[2]    - token: claim_token to store ('' for none)
--   ARGV[3]    - revision: to store
--   ARGV[4]    - cycle_index
--   ARGV[5]    - status
--   ARGV[6]    - term: '1' if the body carries a terminal_result
--   ARGV[7]    - body: blob (shared_state, terminal_result, budget_usage)
--   ARGV[8]    - claimed_cycle: ('' for none)
--   ARGV[9]    - lease_expires_at_ms: ('' for none)
--   ARGV[10]   - delay_ms: 0, or the first cycle is not claimable before this long from now (the
--                timers note in _common.lua); a save (the client sends 0) makes the task due now
--   ARGV[11]   - priority: the task's priority, MIN_PRIORITY..MAX_PRIORITY (the priorities note in _common.lua)
--   ARGV[12]   - concurrency_key: the task's ('' for none; the limits note in _common.lua)
--   ARGV[13]   - n_messages: number of message blobs
--   ARGV[14..] - blobs: the message blobs, then the cycle blobs (the whole history)
-- Returns {REPLY_DONE, epoch} saved; {REPLY_DONE_BEFORE, epoch} this nonce saved
-- already (a re-send writes nothing: it must not clobber what other workers
-- wrote since). Attempts, parking and the last failure are reset, like the rest.
local nonce, token, revision, cycle = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local status, term, body = ARGV[5], ARGV[6], ARGV[7]
local claimed, lease, delay_ms, prio, ckey = ARGV[8], ARGV[9], tonumber(ARGV[10]), ARGV[11], ARGV[12]
local n_m = tonumber(ARGV[13])

local now = server_now_ms()
local due = ''
if delay_ms > 0 then due = fmt(now + delay_ms) end
local h = redis.call('HMGET', KEYS[1], 'applied', 'epoch')
if ring_has(h[1], nonce) then return {REPLY_DONE_BEFORE, h[2]} end
probe(8)
local epoch = write_history(KEYS, '', now, '1', '', -1, -1, ARGV, 14, n_m)
redis.call('ZREM', KEYS[8], task_id_of(KEYS[1]))
redis.call('HSET', KEYS[1], 'status', status, 'cycle', cycle, 'rev', revision,
  'token', token, 'claimed', claimed, 'lease', lease, 'term', term, 'body', body,
  'epoch', epoch, 'applied', ring_push(h[1], nonce), 'att', '0', 'parked', '', 'why', '', 'failrev', '', 'due', due, 'prio', prio,
  'ckey', ckey)
redis.call('DEL', KEYS[10])
-- A save over a terminal task that was set to expire (terminal_ttl_ms) stores
-- what it is given, to be kept: the history was just rewritten without a TTL.
redis.call('PERSIST', KEYS[1])
reindex(KEYS[4], KEYS[5], task_id_of(KEYS[1]), status, term, token, lease, now, due, prio)
return {REPLY_DONE, epoch}
