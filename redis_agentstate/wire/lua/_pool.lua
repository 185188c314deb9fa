-- _pool.lua: prelude prepended to every agent-pool script (see core/pool.py).
--
-- Pool key layout (keys.py builds these; every pool script takes all ten,
-- in this order, and they share one hash slot through the shard tag):
--   KEYS[1]  - ns:{ns#SS}:pool:<pool>              hash   cfg created created_seq seq evt evtids
--   KEYS[2]  - ns:{ns#SS}:pool-members:<pool>      hash   run_id -> member blob
--   KEYS[3]  - ns:{ns#SS}:pool-msgs:<pool>         hash   message_id -> stored message blob
--   KEYS[4]  - ns:{ns#SS}:pool-msg-dedupe:<pool>   hash   idempotency key -> '<seq>:<receipt blob>'
--   KEYS[5]  - ns:{ns#SS}:pool-wakes:<pool>        hash   condition_id -> stored wake blob
--   KEYS[6]  - ns:{ns#SS}:pool-wake-dedupe:<pool>  hash   idempotency key -> '<seq>:<registration blob>'
--   KEYS[7]  - ns:{ns#SS}:pool-log:<pool>          stream the record log: entry id '<seq>-0',
--                                                         fields k (kind) and p (payload blob)
--   KEYS[8]  - ns:{ns#SS}:pools                    zset   every pool id of the shard (score 0)
--   KEYS[9]  - ns:{ns#SS}:pool-runs:<pool>         hash   run_id -> '<seq>' of a member's join, or
--                                                         '<seq>:<member blob>' of a recent leave
--   KEYS[10] - ns:{ns#SS}:pool-left:<pool>         zset   run ids with a leave in KEYS[9], score = its seq
--
-- 'seq' in KEYS[1] is the sequence of the last record appended. Records are
-- numbered 1, 2, 3, ... from this counter inside the same script that changes
-- the state, so the log has no gap and no repeat however many processes
-- write, and no state change exists without its record (or the reverse).
-- 'evt' is the counter behind next_event_sequence ('evtids' the numbers it gave last, see
-- pool_next_event_sequence.lua); 'created' is '0' or '1'
-- and 'created_seq' the sequence of the pool_created record; 'cfg' is the
-- config blob as first opened. Blobs are versioned msgpack, opaque here:
-- every value a script compares is passed in its own ARGV.
--
-- KEYS[9] and KEYS[10] make a join, leave or record_created re-sent by anyone
-- recognisable by what it writes (no per-call key): the same member joined
-- again, a leave of a run that already left, a second record_created. Leaves
-- are remembered for the pool's last few (ARGV), so both keys stay bounded.

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

-- '<seq>:<blob>' -> seq string, blob; nil if the value is not of that form.
local function split_seq(value)
  local i = string.find(value, ':', 1, true)
  if not i then return nil end
  return string.sub(value, 1, i - 1), string.sub(value, i + 1)
end

-- Store `stored` under `id` in items_key and append its record, unless the
-- idempotency `key` is in dedupe_key already: then nothing is written and
-- the first record's seq is returned (record_message and record_wake).
local function record_once(kind, items_key, dedupe_key, id, key, dedupe_blob, stored, maxlen)
  if not is_open() then return { POOL_NOT_OPEN } end
  local first = redis.call('HGET', dedupe_key, key)
  if first then
    local seq = split_seq(first)
    if not seq then return { POOL_MALFORMED_ENTRY } end
    return { POOL_DONE_BEFORE, seq }
  end
  local seq = append(kind, stored, maxlen)
  redis.call('HSET', items_key, id, stored)
  redis.call('HSET', dedupe_key, key, fmt(seq) .. ':' .. dedupe_blob)
  return { POOL_DONE, seq }
end

-- Appends one bounded page of the snapshot to out:
--   cfg created seq, then for each of members, messages and wakes:
--   next_cursor n field1 value1 ... (n = 2 x fields; next_cursor '' = done).
-- cursors: the three HSCAN cursors ('0' to start, '' for a hash already read).
-- One page reads at most about `count` fields of each hash (HSCAN COUNT); the
-- client pages on and replays the log over the pages (see core/pool.py).
local function snapshot_page(out, cursors, count)
  local h = redis.call('HMGET', KEYS[1], 'cfg', 'created', 'seq')
  local n = #out
  out[n + 1] = h[1] or ''
  out[n + 2] = h[2] or '0'
  out[n + 3] = h[3] or '0'
  n = n + 3
  local hashes = { KEYS[2], KEYS[3], KEYS[5] }
  for i = 1, 3 do
    if cursors[i] == '' then
      out[n + 1] = ''
      out[n + 2] = 0
      n = n + 2
    else
      local page = redis.call('HSCAN', hashes[i], cursors[i], 'COUNT', count)
      local items = page[2]
      local next_cursor = page[1]
      if next_cursor == '0' then next_cursor = '' end
      out[n + 1] = next_cursor
      out[n + 2] = #items
      n = n + 2
      for j = 1, #items do
        n = n + 1
        out[n] = items[j]
      end
    end
  end
  return out
end

-- ---- data this library did not write ------------------------------------
-- Checked here, before any script body runs (so before any write): a pool
-- state field this library would not have written gets the error reply
-- 'AGENTSTATE_CORRUPT <KEYS index> <field>', a key of another Redis type
-- fails with WRONGTYPE, and the client turns either into a CorruptState
-- naming the key and the pool (wire/; corrupt() is in _base.lua). The
-- probes cover the keys some script writes before it reads them (the log,
-- the message and wake hashes, the run and leave indexes).

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
  redis.call('HLEN', KEYS[9])
  redis.call('ZCARD', KEYS[10])
end
