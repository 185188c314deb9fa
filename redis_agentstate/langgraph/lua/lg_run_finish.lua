-- lg_run_finish.lua: the end of a run, fenced by its attempt's token (or of a rollback begin handed out).
--   KEYS[1] - lgrq:<tid>             the thread's active runs (see _lgrun.lua)
--   KEYS[2] - lgrh:<tid>             the thread's kept runs
--   KEYS[3] - lgr:<tid>\0<run_id>    the run's hash
--   KEYS[4] - lgre:<tid>\0<run_id>   its events
--   ARGV[1] - token of the attempt ('' for a rollback lg_run_begin handed out: its worker is gone)
--   ARGV[2] - status: success, error, interrupted or timeout; or pending: the worker hands the run
--             back (a graceful stop, or a release after a Redis error), still first in the thread's
--             active list, its progress kept; a hand-back is no death (lg_run_begin.lua)
--   ARGV[3] - error: why (the exception, the strategy that interrupted it), '' for none
--   ARGV[4] - ttl: ms the ended run is kept (0: no expiry)
--   ARGV[5] - cap: events kept per run
--   ARGV[6] - gone: '1' to delete the run and its events (a rollback) instead of keeping them
--   ARGV[7] - run id
-- The final event is 'end', data '<status> <error>'; the run leaves the thread's active list.
-- A re-send (the reply was lost) is recognised: a hand-back by the run's 'handed' token, an end
-- by its end marker's 'by' (the token, or 'handed'); it writes nothing and answers as the first
-- execution did (the active runs left are counted now).
-- Returns {REPLY_DONE, active runs left}; {REPLY_REFUSED, 'lost'}: the token does not run it
-- (nothing written).
local token, status, why = ARGV[1], ARGV[2], ARGV[3]
local ttl, cap, gone, run_id = tonumber(ARGV[4]), ARGV[5], ARGV[6] == '1', ARGV[7]
local by = token ~= '' and token or 'handed'

local h = redis.call('HMGET', KEYS[3], 'token', 'status', 'cancel', 'handed')
local handed = token == '' and h[3] == 'rollback'
if not h[2] or (h[2] ~= 'running' and h[2] ~= 'pending') or (not handed and h[1] ~= token) then
  if status == 'pending' then
    if h[2] == 'pending' and token ~= '' and h[4] == token then return {REPLY_DONE, redis.call('LLEN', KEYS[1])} end
  else
    local mark = end_mark(KEYS[3])
    if mark and mark.by == by then return {REPLY_DONE, redis.call('LLEN', KEYS[1])} end
  end
  return {REPLY_REFUSED, 'lost'}
end
if status == 'pending' then
  redis.call('HSET', KEYS[3], 'status', 'pending', 'token', '', 'handed', token, 'updated', fmt(server_now_ms()))
  return {REPLY_DONE, redis.call('LLEN', KEYS[1])}
end
end_run(KEYS[1], KEYS[2], KEYS[3], KEYS[4], run_id, status, why, server_now_ms(), ttl, cap, gone, by)
return {REPLY_DONE, redis.call('LLEN', KEYS[1])}
