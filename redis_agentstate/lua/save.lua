-- save.lua: store a checkpoint unconditionally (admin / import), replacing
-- whatever the task held, history included.
--   KEYS[1..7], ARGV[1..14+] - exactly as create.lua
-- Returns {1, epoch} saved; {2, epoch} this nonce saved already (a re-send writes
-- nothing: it must not clobber what other workers wrote since).
local nonce, token, revision, cycle = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local status, term, body = ARGV[5], ARGV[6], ARGV[7]
local claimed, lease = ARGV[12], ARGV[13]

local now = server_now_ms()
local h = redis.call('HMGET', KEYS[1], 'applied', 'epoch')
if was_applied(h[1], nonce) then return {2, h[2]} end
local epoch = write_history(KEYS, '', now)
redis.call('HSET', KEYS[1], 'status', status, 'cycle', cycle, 'rev', revision,
  'token', token, 'claimed', claimed, 'lease', lease, 'term', term, 'body', body,
  'epoch', epoch, 'applied', remember(h[1], nonce))
reindex(KEYS[4], KEYS[5], task_id_of(KEYS[1]), status, term, token, lease, now)
return {1, epoch}
