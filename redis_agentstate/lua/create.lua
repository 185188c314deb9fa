-- create.lua: store a new checkpoint; refuse if the task already exists.
--   KEYS[1..7]  - the task's keys (see _common.lua)
--   ARGV[1]     - nonce of this call (a re-send after a lost reply returns 2)
--   ARGV[2]     - claim_token to store ('' for none)
--   ARGV[3]     - revision to store
--   ARGV[4]     - cycle_index
--   ARGV[5]     - status
--   ARGV[6]     - '1' if the body carries a terminal_result
--   ARGV[7]     - body blob (shared_state, terminal_result, budget_usage)
--   ARGV[8..11] - history header (write_history; a new task always starts one)
--   ARGV[12]    - claimed_cycle ('' for none)
--   ARGV[13]    - lease_expires_at_ms ('' for none)
--   ARGV[14]    - number of message blobs; then the message blobs, then the cycle blobs
-- Returns {1, epoch} created; {2, epoch} this nonce created it already; {0} it exists.
local nonce, token, revision, cycle = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local status, term, body = ARGV[5], ARGV[6], ARGV[7]
local claimed, lease = ARGV[12], ARGV[13]

local h = redis.call('HMGET', KEYS[1], 'applied', 'epoch')
if h[2] then
  if was_applied(h[1], nonce) then return {2, h[2]} end
  return {0}
end
local now = server_now_ms()
local epoch = write_history(KEYS, '', now)
redis.call('HSET', KEYS[1], 'status', status, 'cycle', cycle, 'rev', revision,
  'token', token, 'claimed', claimed, 'lease', lease, 'term', term, 'body', body,
  'epoch', epoch, 'applied', remember(nil, nonce))
reindex(KEYS[4], KEYS[5], task_id_of(KEYS[1]), status, term, token, lease, now)
return {1, epoch}
