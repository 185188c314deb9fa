-- create.lua: store a new checkpoint; refuse if the task already exists.
--   KEYS[1..7] - the task's keys (see _common.lua)
--   ARGV[1]    - nonce: of this call (a re-send after a lost reply returns REPLY_DONE_BEFORE)
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
-- Returns {REPLY_DONE, epoch} created; {REPLY_DONE_BEFORE, epoch} this nonce
-- created it already; {REPLY_REFUSED} it exists.
local nonce, token, revision, cycle = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local status, term, body = ARGV[5], ARGV[6], ARGV[7]
local claimed, lease, delay_ms, prio, ckey = ARGV[8], ARGV[9], tonumber(ARGV[10]), ARGV[11], ARGV[12]
local n_m = tonumber(ARGV[13])

local h = redis.call('HMGET', KEYS[1], 'applied', 'epoch')
if h[2] then
  if ring_has(h[1], nonce) then return {REPLY_DONE_BEFORE, h[2]} end
  return {REPLY_REFUSED}
end
local now = server_now_ms()
local due = ''
if delay_ms > 0 then due = fmt(now + delay_ms) end
local epoch = write_history(KEYS, '', now, '1', '', -1, -1, ARGV, 14, n_m)
redis.call('HSET', KEYS[1], 'status', status, 'cycle', cycle, 'rev', revision,
  'token', token, 'claimed', claimed, 'lease', lease, 'term', term, 'body', body,
  'epoch', epoch, 'applied', ring_push(nil, nonce), 'due', due, 'prio', prio,
  'ckey', ckey)
reindex(KEYS[4], KEYS[5], task_id_of(KEYS[1]), status, term, token, lease, now, due, prio)
return {REPLY_DONE, epoch}
