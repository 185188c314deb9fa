-- lg_run_delete.lua: delete one ended run: its hash, its events and its entry in the thread's kept
-- runs (LangGraph's DELETE /threads/{thread_id}/runs/{run_id}).
--   KEYS[1] - lgrh:<tid>             the thread's kept runs (see _lgrun.lua)
--   KEYS[2] - lgr:<tid>\0<run_id>    the run's hash
--   KEYS[3] - lgre:<tid>\0<run_id>   its events
--   ARGV[1] - run id
--   ARGV[2] - nonce of this delete (a re-send is recognised by it)
-- A pending or running run is refused: its worker still writes to it (cancel it first). The
-- checkpoints the run wrote stay: they are the thread's history, not the run's. Its end marker is
-- replaced by one saying 'deleted' by this nonce, kept a minute: its joiners wake (and find no
-- run), and a re-send of this delete is recognised.
-- Returns {REPLY_DONE} (a re-send too); {REPLY_REFUSED, 'missing'} no such run;
-- {REPLY_REFUSED, 'active', status}. Nothing is written when refused.
local run_id, nonce = ARGV[1], ARGV[2]

local r = run_of(KEYS[2])
if not r then
  local mark = end_mark(KEYS[2])
  if mark and mark.status == 'deleted' and mark.by == nonce then return {REPLY_DONE} end
  return {REPLY_REFUSED, 'missing'}
end
local bad = bad_run(r)
if bad then return corrupt(2, bad) end
if ACTIVE[r.status] then return {REPLY_REFUSED, 'active', r.status} end
local done = done_key(KEYS[2])
redis.call('DEL', KEYS[2], KEYS[3], done)
redis.pcall('XADD', done, 'MAXLEN', 1, '*', 'status', 'deleted', 'by', nonce, 'asked', '')
redis.pcall('PEXPIRE', done, GONE_MARK_MS)
redis.call('ZREM', KEYS[1], run_id)
return {REPLY_DONE}
