-- _pool.lua: prelude prepended to every agent-pool script (see _pool_core.py).
--
-- Pool key layout (keys.py builds these; every pool script takes the first
-- eight, in this order, and they share one hash slot through the shard tag):
--   KEYS[1] - ns:{ns#SS}:pool:<pool>              hash   cfg created seq evt
--   KEYS[2] - ns:{ns#SS}:pool-members:<pool>      hash   run_id -> member blob
--   KEYS[3] - ns:{ns#SS}:pool-msgs:<pool>         hash   message_id -> stored message blob
--   KEYS[4] - ns:{ns#SS}:pool-msg-dedupe:<pool>   hash   idempotency key -> '<seq>:<receipt blob>'
--   KEYS[5] - ns:{ns#SS}:pool-wakes:<pool>        hash   condition_id -> stored wake blob
--   KEYS[6] - ns:{ns#SS}:pool-wake-dedupe:<pool>  hash   idempotency key -> '<seq>:<registration blob>'
--   KEYS[7] - ns:{ns#SS}:pool-log:<pool>          stream the record log: entry id '<seq>-0',
--                                                        fields k (kind) and p (payload blob)
--   KEYS[8] - ns:{ns#SS}:pools                    zset   every pool id of the shard (score 0)
--   KEYS[9] - ns:{ns#SS}:pool-nonce:<n>:<pool>    string reply of the write with nonce n
--                                                        (only the writes that remember it)
--
-- 'seq' in KEYS[1] is the sequence of the last record appended. Records are
-- numbered 1, 2, 3, ... from this counter inside the same script that changes
-- the state, so the log has no gap and no repeat however many processes
-- write, and no state change exists without its record (or the reverse).
-- 'evt' is the counter behind next_event_sequence; 'created' is '0' or '1';
-- 'cfg' is the config blob as first opened. Blobs are versioned msgpack,
-- opaque here: every value a script compares is passed in its own ARGV.

local function fmt(n)
  return string.format('%d', n)
end

-- Append one record to the log and return its sequence. maxlen > 0 trims
-- the log to the newest maxlen records (exactly, so retention is predictable).
local function append(kind, blob, maxlen)
  local seq = redis.call('HINCRBY', KEYS[1], 'seq', 1)
  local id = fmt(seq) .. '-0'
  if maxlen > 0 then
    redis.call('XADD', KEYS[7], 'MAXLEN', fmt(maxlen), id, 'k', kind, 'p', blob)
  else
    redis.call('XADD', KEYS[7], id, 'k', kind, 'p', blob)
  end
  return seq
end

local function is_open()
  return redis.call('EXISTS', KEYS[1]) == 1
end

-- The reply a write with this nonce already gave (its reply was lost and it
-- is being re-sent), or false.
local function remembered()
  return redis.call('GET', KEYS[9])
end

local function remember(reply, ms)
  redis.call('SET', KEYS[9], reply, 'PX', ms)
end

-- '<seq>:<blob>' -> seq string, blob; nil if the value is not of that form.
local function split_seq(value)
  local i = string.find(value, ':', 1, true)
  if not i then return nil end
  return string.sub(value, 1, i - 1), string.sub(value, i + 1)
end

-- Appends the snapshot to out, read at one moment:
--   cfg created seq n_members <members> n_messages <messages> n_wakes <wakes>
local function snapshot(out)
  local h = redis.call('HMGET', KEYS[1], 'cfg', 'created', 'seq')
  local n = #out
  out[n + 1] = h[1] or ''
  out[n + 2] = h[2] or '0'
  out[n + 3] = h[3] or '0'
  n = n + 3
  for _, key in ipairs({ KEYS[2], KEYS[3], KEYS[5] }) do
    local values = redis.call('HVALS', key)
    n = n + 1
    out[n] = #values
    for i = 1, #values do
      n = n + 1
      out[n] = values[i]
    end
  end
  return out
end

-- ---- data this library did not write ------------------------------------
-- Checked here, before any script body runs (so before any write): a pool
-- state field this library would not have written gets the error reply
-- 'AGENTSTATE_CORRUPT <KEYS index> <field>', a key of another Redis type
-- fails with WRONGTYPE, and the client turns either into a CorruptState
-- naming the key and the pool (_ops.py). The probes cover the keys some
-- script writes before it reads them (the log, the message and wake hashes).
local function corrupt(i, what)
  return redis.error_reply('AGENTSTATE_CORRUPT ' .. i .. ' ' .. what)
end

do
  local h = redis.call('HMGET', KEYS[1], 'seq', 'evt', 'created')
  if h[1] or h[2] or h[3] then
    for i, name in ipairs({ 'seq', 'evt' }) do
      if not h[i] or #h[i] > 16 or not string.match(h[i], '^%d+$') then return corrupt(1, name) end
    end
    if h[3] ~= '0' and h[3] ~= '1' then return corrupt(1, 'created') end
  end
  redis.call('XLEN', KEYS[7])
  redis.call('HLEN', KEYS[3])
  redis.call('HLEN', KEYS[5])
end
