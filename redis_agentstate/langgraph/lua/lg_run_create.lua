-- lg_run_create.lua: a new run of a LangGraph thread, atomic with the thread's multitask check.
--   KEYS[1..9] - the thread's task (keys.TaskKeys.counted(), the _common.lua layout)
--   KEYS[10]   - lgrq:<tid>            the thread's active runs (see _lgrun.lua)
--   KEYS[11]   - lgrh:<tid>            the thread's kept runs
--   KEYS[12]   - lgr:<tid>\0<run_id>   the new run's hash
--   KEYS[13]   - lgre:<tid>\0<run_id>  the new run's events
--   ARGV[1]    - run id (also the nonce that wakes the task: a re-send is recognised)
--   ARGV[2]    - multitask strategy: reject, enqueue, interrupt or rollback
--   ARGV[3]    - stream modes, comma-joined
--   ARGV[4]    - body: the run's input, command, config and metadata (a serializer's blob, opaque)
--   ARGV[5]    - ttl: ms a run ended by this call is kept (interrupt ends the pending runs)
--   ARGV[6]    - cap: events kept per run (XADD MAXLEN)
--   ARGV[7]    - max active: runs a thread may have pending or running at once
--   ARGV[8]    - delay ms: the run starts no earlier than this long from now (server clock; its
--                hash's 'after', which lg_run_begin.lua honours); 0 for at once
-- Strategies, against the thread's active runs: reject refuses while there is one; enqueue
-- queues behind them; interrupt and rollback end every pending one now (interrupted, or deleted
-- for rollback) and ask the running one to stop ('cancel' set, and its stop signal given, see
-- lg_run_cancel.lua: its worker ends it, at once or at its next super-step boundary, and for
-- rollback deletes it and the checkpoints it wrote), then queue.
-- The task is woken when it waits for work (see _lgrun.lua).
-- A thread whose task is terminal (cancelled by `agentstate cancel` or the task store's cancel,
-- or ended otherwise) can never run again: its runs are refused, never accepted to wait for ever.
-- Returns {REPLY_DONE, created ms, active runs ahead, {ids of the runs this call ended},
-- {ids of those it deleted}} (their id entries, lg_run_index.lua, are the client's to expire or
-- delete: another slot); {REPLY_DONE_BEFORE, created ms, ahead, ended, deleted}: this run exists
-- already (a re-send after a lost reply, or a create sent again after a reshard's seal): the
-- first execution's answer, read back from the run's hash, nothing written;
-- {REPLY_REFUSED, 'no-task'} the thread has no task yet (the client
-- creates it and sends this again), {REPLY_REFUSED, 'reject', run id} refused by reject (the
-- active run's id), {REPLY_REFUSED, 'full', n} the thread has max active runs,
-- {REPLY_REFUSED, 'terminal', status} the thread's task is terminal (cancelled); nothing written
-- when refused. A corrupt run hash: an AGENTSTATE_CORRUPT error reply, nothing written.
local run_id, strategy, modes, body = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local ttl, cap, max_active = tonumber(ARGV[5]), ARGV[6], tonumber(ARGV[7])
local delay = tonumber(ARGV[8] or '0') or 0

local existing = redis.call('HMGET', KEYS[12], 'created', 'ahead', 'swept', 'sweptdel')
if existing[1] then
  return {REPLY_DONE_BEFORE, existing[1], existing[2] or '0', split_ids(existing[3]), split_ids(existing[4])}
end
local task = redis.call('HMGET', KEYS[1], 'status', 'term')
if not task[1] then return {REPLY_REFUSED, 'no-task'} end
if is_terminal(task[1], task[2]) then return {REPLY_REFUSED, 'terminal', task[1]} end

local hash_prefix = string.sub(KEYS[12], 1, #KEYS[12] - #run_id)
local event_prefix = string.sub(KEYS[13], 1, #KEYS[13] - #run_id)
local active = redis.call('LRANGE', KEYS[10], 0, -1)
local runs = {}
for i, id in ipairs(active) do
  local r = run_of(hash_prefix .. id)
  if r then
    local bad = bad_run(r)
    if bad then return corrupt(10, 'run ' .. id .. ' ' .. bad) end
    runs[#runs + 1] = { id = id, run = r }
  end
end
if strategy == 'reject' and #runs > 0 then return {REPLY_REFUSED, 'reject', runs[1].id} end
if strategy == 'enqueue' and #runs >= max_active then return {REPLY_REFUSED, 'full', fmt(#runs)} end
redis.call('ZCARD', KEYS[11])
redis.call('XLEN', KEYS[13])

local now = server_now_ms()
-- Entries of the active list without a hash (deleted around us) are dropped with the rest.
for _, id in ipairs(active) do
  if redis.call('EXISTS', hash_prefix .. id) == 0 then redis.call('LREM', KEYS[10], 0, id) end
end
local ahead, ended, deleted = 0, {}, {}
if strategy == 'interrupt' or strategy == 'rollback' then
  for _, e in ipairs(runs) do
    local key, ev = hash_prefix .. e.id, event_prefix .. e.id
    if e.run.status == 'pending' then
      end_run(KEYS[10], KEYS[11], key, ev, e.id, 'interrupted', strategy, now, ttl, cap, strategy == 'rollback', '')
      if strategy == 'rollback' then deleted[#deleted + 1] = e.id else ended[#ended + 1] = e.id end
    else
      -- A rollback asked already stays one (it does more than an interrupt).
      if e.run.cancel ~= 'rollback' then redis.call('HSET', key, 'cancel', strategy, 'updated', fmt(now)) end
      -- Its stop signal too (see lg_run_cancel.lua): an asyncio worker stops its graph at once.
      local stop = stop_key(key)
      redis.pcall('XADD', stop, 'MAXLEN', 1, '*', 'action', redis.call('HGET', key, 'cancel'))
      if ttl > 0 then redis.pcall('PEXPIRE', stop, ttl) end
      ahead = ahead + 1
    end
  end
else
  ahead = #runs
end

redis.call('HSET', KEYS[12], 'status', 'pending', 'strategy', strategy, 'modes', modes, 'created', fmt(now),
  'updated', fmt(now), 'cancel', '', 'token', '', 'attempt', '0', 'worker', '', 'error', '', 'body', body,
  'started', '', 'ended', '', 'deaths', '0', 'ahead', fmt(ahead), 'swept', join_ids(ended),
  'sweptdel', join_ids(deleted), 'after', delay > 0 and fmt(now + delay) or '')
redis.call('RPUSH', KEYS[10], run_id)
-- The history lists newest first by score. Runs created in the newest run's millisecond (or on a
-- server clock that went back, after a failover) go 1/256 ms after it, so the listing keeps their
-- order; a run id would break a tie in no set order. 1/256 is exact on scores of this size, and
-- '%.17g' keeps it (a Lua number is not always sent with every digit).
local newest = redis.call('ZRANGE', KEYS[11], 0, 0, 'REV', 'WITHSCORES')
local score = now
if newest[2] and tonumber(newest[2]) >= now then score = tonumber(newest[2]) + 1 / 256 end
redis.call('ZADD', KEYS[11], string.format('%.17g', score), run_id)
-- A bounded sweep of the history's oldest entries whose run expired (kept runs end with a TTL).
for _, id in ipairs(redis.call('ZRANGE', KEYS[11], 0, 9)) do
  if redis.call('EXISTS', hash_prefix .. id) == 0 then redis.call('ZREM', KEYS[11], id) end
end
wake_thread('run:' .. run_id)
return {REPLY_DONE, fmt(now), fmt(ahead), ended, deleted}
