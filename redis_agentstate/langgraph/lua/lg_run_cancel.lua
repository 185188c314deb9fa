-- lg_run_cancel.lua: stop one run, pending or running, wherever its worker is.
--   KEYS[1] - lgrq:<tid>             the thread's active runs (see _lgrun.lua)
--   KEYS[2] - lgrh:<tid>             the thread's kept runs
--   KEYS[3] - lgr:<tid>\0<run_id>    the run's hash
--   KEYS[4] - lgre:<tid>\0<run_id>   its events
--   KEYS[5] - lgrs:<tid>\0<run_id>   its stop signal (see _lgrun.lua)
--   ARGV[1] - action: interrupt (the run ends 'interrupted', its progress kept) or rollback (the
--             run and the checkpoints it wrote are deleted)
--   ARGV[2] - ttl: ms an ended run is kept
--   ARGV[3] - cap: events kept per run
--   ARGV[4] - run id
--   ARGV[5] - nonce of this cancel (a re-send is recognised by it)
-- A pending run ends here (it wrote nothing; the end marker's 'by' is the nonce). A running one is
-- asked to stop: 'cancel' is set (and the nonce pushed on its 'cancelby' ring), its stop signal
-- gets an entry (its worker, blocked on it while the graph runs, stops the graph at once), and
-- lg_run_emit.lua answers it at the next event or super-step boundary; if that worker is gone, the
-- next worker of the thread ends it (lg_run_begin.lua).
-- A re-send answers what the first execution did, nothing written: 'ended' if the end marker says
-- this nonce ended it, 'asked' if the run (or its end marker, once it ended) has the nonce in its
-- 'cancelby' ring, even after its worker ended or rolled it back since.
-- Returns {REPLY_DONE, 'ended'} or {REPLY_DONE, 'asked'}; {REPLY_REFUSED, 'missing'} no such run;
-- {REPLY_REFUSED, 'final', status} it ended already. Nothing is written when refused.
local action, ttl, cap, run_id, nonce = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4], ARGV[5]

local r = run_of(KEYS[3])
local asked = r and redis.call('HGET', KEYS[3], 'cancelby')
if not r or not ACTIVE[r.status] then
  local mark = end_mark(KEYS[3])
  if mark and mark.by == nonce then return {REPLY_DONE, 'ended'} end
  if ring_has(asked, nonce) or (mark and ring_has(mark.asked, nonce)) then return {REPLY_DONE, 'asked'} end
end
if not r then return {REPLY_REFUSED, 'missing'} end
local bad = bad_run(r)
if bad then return corrupt(3, bad) end
if not ACTIVE[r.status] then return {REPLY_REFUSED, 'final', r.status} end
if ring_has(asked, nonce) then return {REPLY_DONE, 'asked'} end
local now = server_now_ms()
if r.status == 'pending' then
  end_run(KEYS[1], KEYS[2], KEYS[3], KEYS[4], run_id, 'interrupted', 'cancelled', now, ttl, cap, action == 'rollback',
    nonce)
  return {REPLY_DONE, 'ended'}
end
-- A rollback asked after an interrupt wins: it does more (an interrupt after a rollback stays one).
if r.cancel ~= 'rollback' then redis.call('HSET', KEYS[3], 'cancel', action) end
-- pcall: a signal of another type (data we did not write) must not fail the cancel half-written;
-- the worker then sees the stop at its next boundary, as before the signal.
redis.pcall('XADD', KEYS[5], 'MAXLEN', 1, '*', 'action', redis.call('HGET', KEYS[3], 'cancel'))
if ttl > 0 then redis.pcall('PEXPIRE', KEYS[5], ttl) end
redis.call('HSET', KEYS[3], 'cancelby', ring_push(asked, nonce), 'updated', fmt(now))
return {REPLY_DONE, 'asked'}
