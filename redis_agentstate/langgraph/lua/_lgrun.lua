-- _lgrun.lua: prelude of the LangGraph run-queue scripts (redis_agentstate/langgraph/_runs_core.py),
-- after _base.lua, _moved.lua and _common.lua (whose task helpers wake a thread's task).
--
-- A run queue's namespace holds, per LangGraph thread <tid> (SS is the shard of the thread id, so
-- every key below shares the slot of the thread's task, keys.RunKeys):
--   ns:{ns#SS}:cp:<tid> ...             the thread's task (a CheckpointStore task, _common.lua):
--                                       claimable ('running') while the thread has a run to
--                                       execute, 'wait_user' while it has none; GraphWorkers
--                                       claim_next it, so the fleet's woken claims drive runs
--   ns:{ns#SS}:lgrq:<tid>               list   the thread's active runs (pending, running), oldest
--                                              first: the head is the one executing (or next)
--   ns:{ns#SS}:lgrh:<tid>               zset   every kept run of the thread -> created (server ms)
--                                              (a tie with the newest goes 1/256 ms after it, so the
--                                              scores keep creation order: lg_run_create.lua)
--   ns:{ns#SS}:lgr:<tid>\0<run_id>      hash   the run (RUN_FIELDS below)
--   ns:{ns#SS}:lgre:<tid>\0<run_id>     stream its events: fields 'event', 'type', 'data'
--   ns:{ns#SS}:lgrd:<tid>\0<run_id>     stream one entry once the run ended: what a join blocks on
--                                       (XREAD), woken once, not at every event. Fields: 'status'
--                                       (its final status, 'gone' for a rolled-back run, 'deleted'
--                                       for one lg_run_delete.lua deleted), 'by' (who ended it: the
--                                       attempt's token, 'handed' for a rollback lg_run_begin handed
--                                       out, a cancel's or a delete's nonce, '' otherwise) and
--                                       'asked' (the nonce ring of the cancels that asked it to stop):
--                                       a re-sent end, cancel or delete reads it to know it applied
--   ns:{ns#SS}:lgrs:<tid>\0<run_id>     stream one entry once a cancel asked the running run to stop
--                                       (field 'action'): what its worker blocks on (XREAD) while
--                                       the graph runs, so a cancel stops a run inside a long node
--                                       at once; deleted when the run ends
-- Run hash fields beside RUN_FIELDS, for re-sends (a reply lost, the same call sent again):
--   'deaths'   attempts that ended with the worker's lease lapsing (no hand-back): max attempts counts these
--   'before'   the status the run had when its current attempt began ('pending' or 'running')
--   'swept'    the ids (NUL-joined) of the runs the call that created the run, or began its current
--              attempt, ended on its way ('sweptdel': deleted), so that a re-send answers them too
--   'ahead'    active runs ahead of it when it was created
--   'eseq'     the sequence number of the current attempt's last emit (lg_run_emit.lua)
--   'handed'   the token of the attempt that handed the run back (lg_run_finish.lua, status pending)
--   'cancelby' the nonce ring of the cancels that asked the running run to stop (lg_run_cancel.lua)
-- A run's own keys are built here from the prefix KEYS give ('...lgr:<tid>\0', '...lgre:<tid>\0'):
-- the same slot by construction, and a relocated call (wire/relocation.py) rewrites the prefix
-- with the rest of its KEYS.

local RUN_FIELDS = { 'status', 'strategy', 'modes', 'created', 'updated', 'cancel', 'token', 'attempt',
  'worker', 'error', 'body', 'started', 'ended' }
local ACTIVE = { pending = true, running = true }
local FINAL = { success = true, error = true, interrupted = true, timeout = true }

-- The run's hash as a table of RUN_FIELDS, or nil when there is no such run.
local function run_of(key)
  local v = redis.call('HMGET', key, unpack(RUN_FIELDS))
  if not v[1] then return nil end
  local r = {}
  for i, f in ipairs(RUN_FIELDS) do r[f] = v[i] or '' end
  return r
end

-- The run's stored status is one this library writes: else the run's key is corrupt.
local function bad_run(r)
  if not (ACTIVE[r.status] or FINAL[r.status]) then return 'status' end
  if r.cancel ~= '' and r.cancel ~= 'interrupt' and r.cancel ~= 'rollback' then return 'cancel' end
  if r.attempt ~= '' and not string.find(r.attempt, '^%d+$') then return 'attempt' end
  return nil
end

-- The run's end marker, beside its hash ``key`` (same tid and run id, kind lgrd).
local function done_key(key)
  local i = string.find(key, '}:lgr:', 1, true)
  return string.sub(key, 1, i - 1) .. '}:lgrd:' .. string.sub(key, i + 6)
end

-- The run's stop signal, beside its hash ``key`` (kind lgrs).
local function stop_key(key)
  local i = string.find(key, '}:lgr:', 1, true)
  return string.sub(key, 1, i - 1) .. '}:lgrs:' .. string.sub(key, i + 6)
end

-- How long the end marker of a deleted (rolled-back) run stays, so that its joiners wake.
local GONE_MARK_MS = 60000

-- End run ``id`` (hash ``key``, events ``ev``) as ``status`` now: its final event, its end
-- marker, its retention, out of the thread's active list ``queue``. ``gone``: a rollback, the run
-- and its events deleted (the thread's history ``hist`` forgets it) instead of kept ``ttl`` ms.
-- ``by``: who ends it (the end marker's 'by', see above).
local function end_run(queue, hist, key, ev, id, status, why, now, ttl, cap, gone, by)
  redis.call('LREM', queue, 0, id)
  redis.call('DEL', stop_key(key))
  local done = done_key(key)
  local asked = redis.call('HGET', key, 'cancelby') or ''
  -- pcall: a marker of another type (data we did not write) must not fail the end half-written;
  -- its joiners then wait out their timeouts, re-reading the run each slice.
  redis.pcall('XADD', done, 'MAXLEN', 1, '*', 'status', gone and 'gone' or status, 'by', by, 'asked', asked)
  if gone then
    redis.call('DEL', key, ev)
    redis.call('ZREM', hist, id)
    redis.pcall('PEXPIRE', done, GONE_MARK_MS)
    return
  end
  if ttl > 0 then redis.pcall('PEXPIRE', done, ttl) end
  redis.call('HSET', key, 'status', status, 'error', why, 'updated', fmt(now), 'ended', fmt(now), 'token', '')
  redis.call('XADD', ev, 'MAXLEN', cap, '*', 'event', 'end', 'type', 'status', 'data', status .. ' ' .. why)
  if ttl > 0 then
    redis.call('PEXPIRE', key, ttl)
    redis.call('PEXPIRE', ev, ttl)
  end
end

-- The end marker of the run whose hash is ``key``, as a table of its fields, or nil (none, or
-- not a stream: data we did not write answers as no marker).
local function end_mark(key)
  local ok, entries = pcall(redis.call, 'XREVRANGE', done_key(key), '+', '-', 'COUNT', 1)
  if not ok or not entries or not entries[1] then return nil end
  local m, f = {}, entries[1][2]
  for i = 1, #f - 1, 2 do m[f[i]] = f[i + 1] end
  return m
end

-- Run ids joined for a hash field (run ids hold no NUL), and back.
local function join_ids(ids)
  return table.concat(ids, '\0')
end

local function split_ids(s)
  local out, at = {}, 1
  if not s or s == '' then return out end
  while true do
    local cut = string.find(s, '\0', at, true)
    out[#out + 1] = string.sub(s, at, (cut or 0) - 1)
    if not cut then return out end
    at = cut + 1
  end
end

-- Make the thread's task (KEYS[1..9], the _common.lua layout) claimable if it waits for work:
-- resume.lua's change without a message, named by ``nonce``. True if it woke it now.
local function wake_thread(nonce)
  local h, applied, early = nonce_decision(KEYS, nonce)
  if early then return false end
  if h[1] ~= WAIT_USER or is_terminal(h[1], h[7]) or h[11] == '1' then return false end
  local now = server_now_ms()
  local rev = tonumber(h[3]) + 1
  probe(4, 5)
  redis.call('HSET', KEYS[1], 'status', 'running', 'rev', fmt(rev), 'token', '', 'claimed', '', 'lease', '',
    'due', '', 'att', '0', 'why', '', 'failrev', '', 'applied', ring_push(applied, nonce))
  reindex(KEYS[4], KEYS[5], task_id_of(KEYS[1]), 'running', h[7], '', '', now, '', h[15])
  return true
end
