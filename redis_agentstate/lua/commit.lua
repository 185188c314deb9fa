-- commit.lua: write the checkpoint of a claimed cycle, fenced by revision.
--   KEYS[1..7]  - the task's keys (see _common.lua)
--   ARGV[1]     - identity of this write: a digest of its content (a re-send returns 2)
--   ARGV[2]     - claim token that holds the cycle
--   ARGV[3]     - expected revision (the one the claim returned)
--   ARGV[4]     - cycle_index of the checkpoint (must equal the claimed cycle)
--   ARGV[5..7]  - status, term flag, body blob (as create.lua)
--   ARGV[8..11] - history header (write_history)
--   ARGV[12,13] - unused ('')
--   ARGV[14]    - number of new message blobs; then message blobs, then cycle blobs
-- The lease need not be unexpired: if nobody claimed since, the revision is
-- unchanged and the fence holds.
-- Returns {1, epoch} applied (revision + 1, claim cleared); {2, epoch} this
-- write applied already; {0} fenced out; {-5} resend full history; {-6} shrink.
local id, token, expected, cycle = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local status, term, body = ARGV[5], ARGV[6], ARGV[7]

local h = redis.call('HMGET', KEYS[1], 'rev', 'token', 'claimed', 'applied', 'epoch')
if h[1] and not int_in(h[1], 0, MAX_REVISION) then return corrupt(1, 'rev') end
if not h[1] or tonumber(h[1]) ~= expected or h[2] ~= token or h[3] ~= cycle then
  -- Fenced out, unless this very write applied already, whatever happened
  -- since: other workers claimed and committed, or the task was acknowledged
  -- (deleted: the tombstone keeps the ring), maybe even created again.
  if h[1] and was_applied(h[4], id) then return {2, h[5]} end
  if was_applied(redis.call('GET', KEYS[7]), id) then return {2, ''} end
  return {0}
end

local now = server_now_ms()
local epoch, err = write_history(KEYS, h[5], now)
if not epoch then
  if err == 'resend' then return {-5} end
  return {-6}
end
redis.call('HSET', KEYS[1], 'status', status, 'cycle', cycle, 'rev', fmt(expected + 1),
  'token', '', 'claimed', '', 'lease', '', 'term', term, 'body', body,
  'epoch', epoch, 'applied', remember(h[4], id))
reindex(KEYS[4], KEYS[5], task_id_of(KEYS[1]), status, term, '', '', now)
return {1, epoch}
