-- finalize.lua: write a terminal checkpoint; only when nobody holds a claim.
--   KEYS[1..7]  - the task's keys (see _common.lua)
--   ARGV[1]     - identity of this write: a digest of its content (a re-send returns 2)
--   ARGV[2]     - unused ('')
--   ARGV[3]     - expected revision
--   ARGV[4..7]  - cycle_index, status, term flag ('1'), body blob
--   ARGV[8..11] - history header (write_history)
--   ARGV[12,13] - unused ('')
--   ARGV[14]    - number of new message blobs; then message blobs, then cycle blobs
-- Returns {1, epoch} applied (revision + 1); {2, epoch} this write applied
-- already; {0} missing, wrong revision, claimed, or already terminal;
-- {-5} resend full history; {-6} shrink.
local id, expected, cycle = ARGV[1], tonumber(ARGV[3]), ARGV[4]
local status, term, body = ARGV[5], ARGV[6], ARGV[7]

local h = redis.call('HMGET', KEYS[1], 'rev', 'token', 'term', 'applied', 'epoch')
if h[1] and not int_in(h[1], 0, MAX_REVISION) then return corrupt(1, 'rev') end
if not h[1] or tonumber(h[1]) ~= expected or h[2] ~= '' or h[3] == '1' then
  -- Refused, unless this very write applied already (see commit.lua).
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
