-- lg_run_begin.lua: a GraphWorker that claimed a thread's task takes the thread's next run.
--   KEYS[1] - lgrq:<tid>      the thread's active runs (see _lgrun.lua)
--   KEYS[2] - lgrh:<tid>      the thread's kept runs
--   KEYS[3] - lgr:<tid>\0     the prefix of the thread's run hashes (not itself a key)
--   KEYS[4] - lgre:<tid>\0    the prefix of their event streams (not itself a key)
--   KEYS[5] - cp:<tid>        the thread's task (optional, with ARGV[6]): its claim is checked
--   ARGV[1] - token: this attempt's (every event and the end of the run are fenced by it)
--   ARGV[2] - worker: a name for people (agentstate langgraph runs)
--   ARGV[3] - max attempts: a run whose worker died this many times ends as an error (a poison run)
--   ARGV[4] - ttl: ms a run ended here is kept
--   ARGV[5] - cap: events kept per run
--   ARGV[6] - the revision the worker's claim of the task returned ('' or absent: not checked)
-- With KEYS[5] and ARGV[6], the run is begun only under the worker's claim of the thread's task
-- (its token ARGV[1] and revision ARGV[6] still the task's: nobody claimed it since), else
-- {REPLY_REFUSED, 'lost', {}} and nothing written. A worker that took the thread's saver lease
-- first and begins under it so knows, in this one call, that no other worker moved the thread on
-- while it stalled (the claim a takeover needs bumps the revision); a re-send passes the same check.
-- The head of the active list is the thread's next run (runs of a thread execute in creation
-- order). A head that was running under another token is an attempt whose worker died or
-- stalled (its task lease lapsed, no hand-back): it is taken over, the death counted ('deaths'),
-- and it resumes from the thread's last checkpoint; a run handed back (pending again, lg_run_finish
-- with status pending: a graceful stop, or a release after a Redis error) is no death. Only deaths
-- count toward max attempts: the begin after the max_att-th death ends the run as an error.
-- 'attempt' counts every attempt (a person's view of it). A head asked to stop (cancel set) whose
-- worker is gone ends here (interrupt), or is handed to the caller to delete its checkpoints
-- (rollback). Each attempt starts with a 'metadata' event {"run_id", "attempt"}.
-- A re-send (the head runs under this very token already: the reply was lost) writes nothing and
-- answers as the first execution did (attempt, status before, the runs it ended, from the hash).
-- A pending head created with a delay (its hash's 'after', lg_run_create.lua) that is not due yet
-- is not begun: {REPLY_REFUSED, 'later', run id, ms until it is due, ended}, nothing written for it
-- (the worker puts the thread's task off that long; the runs behind it wait, in creation order).
-- Returns {REPLY_DONE, 'run', run id, attempt, body, modes, strategy, created, status before,
-- ended}: execute it; {REPLY_DONE, 'rollback', run id, ended}: delete its checkpoints, then
-- lg_run_finish with gone; {REPLY_REFUSED, 'idle', ended}: no active run. ``ended``: the ids of
-- the runs this call ended on its way to the head (their id entries are the client's to expire).
-- A corrupt run hash: AGENTSTATE_CORRUPT, nothing written.
local token, worker, max_att = ARGV[1], ARGV[2], tonumber(ARGV[3])
local ttl, cap = tonumber(ARGV[4]), ARGV[5]
local claimed = ARGV[6] or ''

if claimed ~= '' then
  local t = redis.call('HMGET', KEYS[5], 'rev', 'token')
  if t[1] ~= claimed or t[2] ~= token then return {REPLY_REFUSED, 'lost', {}} end
end

local now = server_now_ms()
local ended = {}
for _ = 1, 1000 do
  local head = redis.call('LINDEX', KEYS[1], 0)
  if not head then return {REPLY_REFUSED, 'idle', ended} end
  local key, ev = KEYS[3] .. head, KEYS[4] .. head
  local r = run_of(key)
  if not r then
    redis.call('LPOP', KEYS[1])
  else
    local bad = bad_run(r)
    if bad then return corrupt(3, 'run ' .. head .. ' ' .. bad) end
    local attempt = tonumber(r.attempt ~= '' and r.attempt or '0') + 1
    local deaths = tonumber(redis.call('HGET', key, 'deaths') or '0') or 0
    if r.status == 'running' and r.token == token then
      local again = redis.call('HMGET', key, 'before', 'swept')
      return {REPLY_DONE, 'run', head, r.attempt, r.body, r.modes, r.strategy, r.created, again[1] or 'pending',
        split_ids(again[2])}
    end
    if r.status == 'running' then deaths = deaths + 1 end
    if r.cancel == 'rollback' then
      return {REPLY_DONE, 'rollback', head, ended}
    elseif r.cancel ~= '' then
      end_run(KEYS[1], KEYS[2], key, ev, head, 'interrupted', r.cancel, now, ttl, cap, false, '')
      ended[#ended + 1] = head
    elseif r.status == 'pending' and (tonumber(redis.call('HGET', key, 'after') or '') or 0) > now then
      return {REPLY_REFUSED, 'later', head, fmt(tonumber(redis.call('HGET', key, 'after')) - now), ended}
    elseif r.status == 'running' and deaths >= max_att then
      end_run(KEYS[1], KEYS[2], key, ev, head, 'error', 'lost its worker ' .. fmt(deaths) .. ' times',
        now, ttl, cap, false, '')
      ended[#ended + 1] = head
    else
      redis.call('HSET', key, 'status', 'running', 'token', token, 'attempt', fmt(attempt), 'worker', worker,
        'updated', fmt(now), 'deaths', fmt(deaths), 'before', r.status, 'swept', join_ids(ended), 'eseq', '0')
      if r.started == '' then redis.call('HSET', key, 'started', fmt(now)) end
      redis.call('XADD', ev, 'MAXLEN', cap, '*', 'event', 'metadata', 'type', 'json',
        'data', '{"run_id": "' .. head .. '", "attempt": ' .. fmt(attempt) .. '}')
      return {REPLY_DONE, 'run', head, fmt(attempt), r.body, r.modes, r.strategy, r.created, r.status, ended}
    end
  end
end
return {REPLY_REFUSED, 'idle', ended}
