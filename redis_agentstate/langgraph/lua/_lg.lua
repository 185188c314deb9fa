-- _lg.lua: prelude of every LangGraph-thread script (see redis_agentstate/langgraph/_core.py).
--
-- Every script takes the keys of one thread, in this order (keys.ThreadKeys; all
-- in the slot of the thread's shard, so a script runs unchanged on Redis Cluster):
--   KEYS[1]  lgmeta:<tid>   hash  holder, exp: the thread's lease (no holder when free); released: the
--                                   token of the last release (a minute, see lg_release.lua)
--   KEYS[2]  lgcp:<tid>     hash  <ns>\0<cid> -> a stored checkpoint (below), as earlier versions
--                                   stored them; this one stores them in KEYS[3]
--   KEYS[3]  lgidx:<tid>    zset  <ns>\0<cid>\0<stored checkpoint> (or <ns>\0<cid> alone, its record
--                                   in KEYS[2]), score 0: lex order is id order
--   KEYS[4]  lgblob:<tid>   hash  <ns>\0<channel>\0<version> -> 'F'<value> or a tail (below)
--   KEYS[5]  lgw:<tid>      hash  <ns>\0<cid> -> the checkpoint's pending writes, packed: one
--                                   '<n>:<task_id>\0<idx><m>:<write>' per write (n, m: lengths),
--                                   for a checkpoint stored in KEYS[2] or not stored (yet)
--
-- A stored checkpoint is '<n>:' + the n bytes of the blob fields it reads (each '<len>:<field>'),
-- then 'W<k>:' + its k bytes of packed pending writes when it holds them (a checkpoint stored in
-- KEYS[3] whose writes are not in KEYS[5]), then its record (opaque: msgpack, never 'W').
-- One sorted-set entry per checkpoint, not a hash entry, an index entry and a writes entry: a
-- third of a thread's memory (benchmarks/lg_layouts.py).
--   KEYS[6]  lgrun:<tid>    zset  <run_id>\0<ns>\0<cid>, score 0
--   KEYS[7]  lgrel:<tid>    list  release notices for lease waiters
--   KEYS[8]  lgthreads      zset  thread ids of the shard, score 0
--   KEYS[9]  lgruns         zset  <run_id>\0<tid> of the shard, score 0
--
-- A tail blob 'T<n>:<base version><value>' holds the items a list channel gained
-- since version <base version> of the same channel; readers rebuild the list from
-- the chain of bases down to a full value. No id the library stores contains NUL.
--
-- Shared values (see redis_agentstate/langgraph/_compact.py): a full value or a pending
-- write at least SHARE_BYTES long is stored once per thread, in KEYS[4] under the field
-- '\0\0' + its 16-byte digest (no blob field starts so: channels are never empty), and
-- referenced: a blob as 'R' + digest, a write as 'R' + digest + the rest of the write. Replies
-- carry the value, not the reference: a blob as the shared 'F' value, a write as
-- 'X<n>:' + the n bytes of the shared value + the rest; a shared value longer than DEFER_BYTES
-- as its field instead (a blob as {field, length}, a write as 'Y' + field + the rest), which
-- the reader reads with a plain HGET, so no script copies more than a page's budget of values. Prune and delete_for_runs keep a shared
-- value while a kept blob or a kept write references it (mark and sweep, in one script).

local SEP = '\0'

-- Fail with WRONGTYPE before the first write if any key is of another Redis type
-- (the driver then names the key).
local function probe()
  for _, key in ipairs({ KEYS[1], KEYS[2], KEYS[4], KEYS[5] }) do redis.call('HLEN', key) end
  for _, key in ipairs({ KEYS[3], KEYS[6], KEYS[8], KEYS[9] }) do redis.call('ZCARD', key) end
  redis.call('LLEN', KEYS[7])
end

-- The expiry (server ms) of a lease as lg_lease.lua writes it: ASCII digits. Anything else
-- (a hand-edited 'inf', '1e400', which tonumber reads as a lease for ever) holds nothing: 0.
local function lease_exp(raw)
  local ms = 0
  if raw and #raw <= 15 and string.match(raw, '^%d+$') then ms = tonumber(raw) end
  return ms
end

-- '' when the caller may write: token holds a live lease on the thread, or token is ''
-- and no live lease is held. 'busy': a live lease is held and the caller holds none.
-- 'lost': the caller's token no longer holds a live lease (it expired on the server
-- clock, whether or not another writer has taken the thread since).
local function fence(token, now)
  local h = redis.call('HMGET', KEYS[1], 'holder', 'exp')
  if token == '' then
    if h[1] and lease_exp(h[2]) > now then return 'busy' end
    return ''
  end
  if h[1] ~= token or lease_exp(h[2]) <= now then return 'lost' end
  return ''
end

-- True while somebody holds a live lease on the thread.
local function leased(now)
  local h = redis.call('HMGET', KEYS[1], 'holder', 'exp')
  return h[1] ~= false and h[1] ~= nil and lease_exp(h[2]) > now
end

-- Expiry of every data key of the thread (not the lease: it has its own).
local function touch(ttl)
  if ttl == '' then return end
  for i = 2, 6 do redis.call('PEXPIRE', KEYS[i], ttl) end
end

-- Parsers of stored values: each answers nil (or false) for a value this library did not
-- write, never loops and never errors, so a script can check everything it reads before its
-- first write (a Lua error after a write is not rolled back, and makes SCRIPT KILL impossible).

-- The length n of the '<n>:' at byte i of s and the position of its colon, if n is a decimal
-- whose n bytes after the colon are all in s; nil otherwise.
local function length_at(s, i)
  local c = string.find(s, ':', i, true)
  if not c or c == i or c - i > 10 then return nil end
  local digits = string.sub(s, i, c - 1)
  if not string.find(digits, '^%d+$') then return nil end
  local n = tonumber(digits)
  if c + n > #s then return nil end
  return n, c
end

-- The fields of a '<len>:<field>' list, or nil if it is malformed.
local function split_fields(list)
  local out, i = {}, 1
  while i <= #list do
    local n, c = length_at(list, i)
    if not n then return nil end
    out[#out + 1] = string.sub(list, c + 1, c + n)
    i = c + n + 1
  end
  return out
end

-- The '<len>:<field>' list of blob fields a stored checkpoint reads (the prefix of its value),
-- or nil if the prefix is malformed.
local function reads_of(record)
  local n, c = length_at(record, 1)
  if not n then return nil end
  return string.sub(record, c + 1, c + n)
end

-- The blob fields a stored checkpoint reads, or nil if its value is malformed.
local function fields_of(record)
  local list = reads_of(record)
  return list and split_fields(list)
end

-- The blob field of the base of tail value v stored at field f, nil for a full value, or
-- false for a value that is neither (not data this library wrote).
local function base_of(f, v)
  local kind = string.sub(v, 1, 1)
  if kind == 'F' then return nil end
  if kind == 'R' then
    if #v ~= 17 then return false end
    return nil
  end
  if kind ~= 'T' then return false end
  local n, c = length_at(v, 2)
  if not n then return false end
  local version = string.sub(v, c + 1, c + n)
  local last = 0
  while true do
    local j = string.find(f, SEP, last + 1, true)
    if not j then break end
    last = j
  end
  return string.sub(f, 1, last) .. version
end

local SHARED = SEP .. SEP
local REF_BYTES = 17
-- A shared value longer than this is not copied through a script (see chain and resolve_writes).
local DEFER_BYTES = 65536

-- The field of the shared value that reference v names, nil if v is not a reference.
local function shared_of(v)
  if #v >= REF_BYTES and string.sub(v, 1, 1) == 'R' then return SHARED .. string.sub(v, 2, REF_BYTES) end
  return nil
end

local MAX_CHAIN = 4096
-- What checkpoint_reply answers for a checkpoint that would take a listing's page past its budget.
local FULL = {}
-- What checkpoint_reply answers, followed by the KEYS index and what is malformed, for
-- data this library did not write (the script then replies corrupt(i, what), an error
-- reply naming KEYS[i]; see wire.CORRUPT_REPLY).
local CORRUPT = 'corrupt'

-- The stored values of blob field f, newest first: a tail chain ends at a full value
-- (or at a missing base, which the reader reports as corrupt). nil plus what is malformed
-- for data this library did not write ('tail-chain': it never ends; 'blob': a value that
-- is neither full nor a tail).
local function chain(f)
  local out = {}
  local v = redis.call('HGET', KEYS[4], f)
  while v do
    local shared = string.sub(v, 1, 1) == 'R' and shared_of(v)
    if shared then
      local n = redis.call('HSTRLEN', KEYS[4], shared)
      if n > DEFER_BYTES then
        -- Too long to carry through a script: the reader reads it with a plain HGET (it is never
        -- changed, only deleted, and a reader that finds it gone reads the checkpoint again).
        out[#out + 1] = {shared, n}
      else
        local full = redis.call('HGET', KEYS[4], shared)
        if not full or string.sub(full, 1, 1) ~= 'F' then return nil, 'shared-value' end
        out[#out + 1] = full
      end
    else
      out[#out + 1] = v
    end
    f = base_of(f, v)
    if f == false then return nil, 'blob' end
    if not f then break end
    -- The library's chains are at most 2 * TAIL_CHAIN long; a loop is data it did not write.
    if #out > MAX_CHAIN then return nil, 'tail-chain' end
    v = redis.call('HGET', KEYS[4], f)
  end
  return out
end

local function range_of(prefix)
  return '[' .. prefix .. SEP, '(' .. prefix .. '\1'
end

local function hdel_all(key, fields)
  for i = 1, #fields, 1000 do
    redis.call('HDEL', key, unpack(fields, i, math.min(i + 999, #fields)))
  end
end

-- The writes of a packed value, as {key, write} pairs in stored order, or nil if it is malformed.
local function unpack_writes(s)
  local out, i = {}, 1
  while i <= #s do
    local n, c = length_at(s, i)
    if not n then return nil end
    local key = string.sub(s, c + 1, c + n)
    i = c + n + 1
    n, c = length_at(s, i)
    if not n then return nil end
    out[#out + 1] = {key, string.sub(s, c + 1, c + n)}
    i = c + n + 1
  end
  return out
end

local function pack_writes(entries)
  local parts = {}
  for j, e in ipairs(entries) do parts[j] = #e[1] .. ':' .. e[1] .. #e[2] .. ':' .. e[2] end
  return table.concat(parts)
end

-- Mark in ``keep`` the shared values the packed writes ``s`` reference; false if ``s`` is malformed.
local function mark_writes(s, keep)
  local entries = unpack_writes(s)
  if not entries then return false end
  for _, e in ipairs(entries) do
    local shared = shared_of(e[2])
    if shared then keep[shared] = true end
  end
  return true
end

-- The packed writes ``s`` with each reference replaced by 'X<n>:' + the shared value + the rest of
-- the write, or by 'Y' + the shared value's field + the rest when it is longer than DEFER_BYTES
-- (the reader reads it itself); ``s`` itself when it holds none or is malformed (the client
-- checks the framing); nil if a referenced value is missing.
local function resolve_writes(s)
  if not string.find(s, 'R', 1, true) then return s end
  local entries = unpack_writes(s)
  if not entries then return s end
  local changed = false
  for _, e in ipairs(entries) do
    local shared = shared_of(e[2])
    if shared then
      if redis.call('HSTRLEN', KEYS[4], shared) > DEFER_BYTES then
        e[2] = 'Y' .. shared .. string.sub(e[2], REF_BYTES + 1)
      else
        local full = redis.call('HGET', KEYS[4], shared)
        if not full then return nil end
        e[2] = 'X' .. #full .. ':' .. full .. string.sub(e[2], REF_BYTES + 1)
      end
      changed = true
    end
  end
  if not changed then return s end
  return pack_writes(entries)
end

-- The index entry of checkpoint m when it is stored in the index ('<m>\0<stored>'), or nil.
local function entry_of(m)
  return redis.call('ZRANGEBYLEX', KEYS[3], '[' .. m .. SEP, '(' .. m .. '\1', 'LIMIT', 0, 1)[1]
end

-- The member of index entry e and its stored checkpoint (nil: stored in KEYS[2], the layout of
-- earlier versions); e itself and nil for an entry with no separator (the reader reports it).
local function split_entry(e)
  local a = string.find(e, SEP, 1, true)
  local b = a and string.find(e, SEP, a + 1, true)
  if not b then return e, nil end
  return string.sub(e, 1, b - 1), string.sub(e, b + 1)
end

-- The members of index entries (as split_entry), in their order.
local function members_of(entries)
  local out = {}
  for i, e in ipairs(entries) do out[i] = (split_entry(e)) end
  return out
end

-- The stored checkpoint m and its index entry (the entry nil: stored in KEYS[2], or absent).
local function record_of(m)
  local e = entry_of(m)
  if e then return string.sub(e, #m + 2), e end
  return redis.call('HGET', KEYS[2], m), nil
end

-- The parts of a stored checkpoint: the end of its list of blob fields, the packed writes it holds
-- (nil: none), and where its record starts; nil if the framing is malformed.
local function parts_of(stored)
  local n, c = length_at(stored, 1)
  if not n then return nil end
  local i = c + n + 1
  if string.sub(stored, i, i) ~= 'W' then return i - 1, nil, i end
  local k, c2 = length_at(stored, i + 1)
  if not k then return nil end
  return i - 1, string.sub(stored, c2 + 1, c2 + k), c2 + k + 1
end

-- The stored checkpoint with ``writes`` as the packed writes it holds ('' or nil: none), or nil if
-- the framing of ``stored`` is malformed.
local function with_writes(stored, writes)
  local reads_end, _, body = parts_of(stored)
  if not reads_end then return nil end
  local held = ''
  if writes and writes ~= '' then held = 'W' .. #writes .. ':' .. writes end
  return string.sub(stored, 1, reads_end) .. held .. string.sub(stored, body)
end

-- The pending writes of checkpoint m whose stored form (nil: not stored) is ``stored``: those of
-- KEYS[5], else those it holds; '' if none, nil if ``stored`` is malformed. Second: true when they are
-- those of KEYS[5].
local function writes_of(m, stored)
  local w = redis.call('HGET', KEYS[5], m)
  if w then return w, true end
  if not stored then return '' end
  local reads_end, held = parts_of(stored)
  if not reads_end then return nil end
  return held or ''
end

-- Store checkpoint m as ``stored`` in the index (replacing entry ``old``, if any, and a record of
-- the earlier layout; ``no_record``: the caller read KEYS[2] and m has no record there).
local function put_record(m, stored, old, no_record)
  if old then redis.call('ZREM', KEYS[3], old) end
  if not no_record then redis.call('HDEL', KEYS[2], m) end
  redis.call('ZREM', KEYS[3], m)
  redis.call('ZADD', KEYS[3], 0, m .. SEP .. stored)
end

-- Remove checkpoint <ns>\0<cid> and its pending writes (not its blobs: see gc_blobs).
local function drop_checkpoint(member)
  local e = entry_of(member)
  if e then redis.call('ZREM', KEYS[3], e) end
  redis.call('HDEL', KEYS[2], member)
  redis.call('ZREM', KEYS[3], member)
  redis.call('HDEL', KEYS[5], member)
end

-- Every stored checkpoint of the thread, both layouts: {member = stored}, and {member = the KEYS
-- index it is stored in (2 or 3)}.
local function all_records()
  local out, where = {}, {}
  local all = redis.call('HGETALL', KEYS[2])
  for i = 1, #all, 2 do out[all[i]], where[all[i]] = all[i + 1], 2 end
  for _, e in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
    local m, stored = split_entry(e)
    if stored then out[m], where[m] = stored, 3 end
  end
  return out, where
end

-- The blob fields each checkpoint of the thread reads: {member = fields}; or nil and the KEYS index
-- of a stored checkpoint that is malformed.
local function all_reads()
  local out = {}
  local records, where = all_records()
  for m, stored in pairs(records) do
    local fields = fields_of(stored)
    if not fields or (where[m] == 3 and not parts_of(stored)) then return nil, where[m] end
    out[m] = fields
  end
  return out
end

-- The blob fields the checkpoints of ``reads`` (as all_reads) read, tails keeping their
-- bases: a set, or nil if one of those blobs is malformed. Read before the first write.
local function blobs_read(reads)
  local keep = {}
  for _, fields in pairs(reads) do
    for _, f in ipairs(fields) do
      while f and not keep[f] do
        keep[f] = true
        local v = redis.call('HGET', KEYS[4], f)
        if v then
          local shared = shared_of(v)
          if shared then keep[shared] = true end
          f = base_of(f, v)
        else
          f = nil
        end
        if f == false then return nil end
      end
    end
  end
  return keep
end

-- Drop every blob not in ``keep`` (see blobs_read).
local function gc_blobs(keep)
  local gone = {}
  for _, f in ipairs(redis.call('HKEYS', KEYS[4])) do
    if not keep[f] then gone[#gone + 1] = f end
  end
  hdel_all(KEYS[4], gone)
end

-- The run of run index member m ('<run_id>\0<ns>\0<cid>'), nil if it has no separator.
local function run_of(m)
  local c = string.find(m, SEP, 1, true)
  return c and string.sub(m, 1, c - 1)
end

-- The runs of the thread's run index (KEYS[6]) as a set, or nil if a member is malformed.
local function index_runs()
  local runs = {}
  for _, m in ipairs(redis.call('ZRANGE', KEYS[6], 0, -1)) do
    local run = run_of(m)
    if not run then return nil end
    runs[run] = true
  end
  return runs
end

-- Drop the shard's run entries of this thread for runs it no longer has (KEYS[6] was
-- checked by index_runs before the first write).
local function gc_runs(tid, runs)
  local still = index_runs() or {}
  for run in pairs(runs) do
    if not still[run] then redis.call('ZREM', KEYS[9], run .. SEP .. tid) end
  end
end

-- Remove thread tid from the shard's thread and run indexes once it has no checkpoint
-- (its keys expired with the saver's ttl, or were deleted): its own run list may be gone
-- with them, so the run index is searched for its entries.
local function forget_thread(tid)
  redis.call('ZREM', KEYS[8], tid)
  local suffix = SEP .. tid
  local cursor = '0'
  repeat
    local page = redis.call('ZSCAN', KEYS[9], cursor, 'COUNT', 1000)
    cursor = page[1]
    for i = 1, #page[2], 2 do
      local m = page[2][i]
      if string.sub(m, -#suffix) == suffix then redis.call('ZREM', KEYS[9], m) end
    end
  until cursor == '0'
end

-- Everything of the thread but its lease; false (nothing written) if its run index is malformed.
local function drop_thread(tid)
  local runs = index_runs()
  if not runs then return false end
  for run in pairs(runs) do redis.call('ZREM', KEYS[9], run .. SEP .. tid) end
  redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6])
  redis.call('ZREM', KEYS[8], tid)
  return true
end

-- Checkpoint <ns>\0<cid> (``stored``: its stored form, read already from its index entry) with
-- everything a reader needs: {member, record (without the writes it holds), blobs, writes, the
-- KEYS index of the record (2 or 3), the KEYS index of the writes (3 or 5)}
-- (blobs = {field, {value, base value, ...}, ...}, each tail chain newest first;
-- writes = its packed pending writes, '' if none) and the bytes of values and writes it
-- carries, nil if there is no such checkpoint, or CORRUPT, KEYS index, what: data this library
-- did not write. ``seen`` (a listing's page): the fields whose chains the reader has already
-- (earlier in this reply, or from its last page); such a field's chain is sent as the integer 1,
-- so checkpoints that read one unchanged value carry it once per listing, not once each. ``room``: the value bytes the page may
-- still take; a checkpoint whose new values are longer (HSTRLEN, before they are read) answers
-- FULL (records are small, and bounded by the page's count).
local function checkpoint_reply(member, seen, room, stored)
  local record, entry = stored, stored
  if not record then record, entry = record_of(member) end
  if not record then return nil end
  local fields = fields_of(record)
  local held = entry and parts_of(record)
  if not fields or (entry and not held) then return CORRUPT, entry and 3 or 2, 'checkpoint' end
  if room then
    local need = 0
    for _, f in ipairs(fields) do
      if not seen[f] then
        local n = redis.call('HSTRLEN', KEYS[4], f)
        if n == REF_BYTES then
          local shared = shared_of(redis.call('HGET', KEYS[4], f))
          if shared then n = redis.call('HSTRLEN', KEYS[4], shared) end
        end
        need = need + n
      end
    end
    if need > 0 and need > room then return FULL end
  end
  local blobs, size = {}, 0
  for _, f in ipairs(fields) do
    blobs[#blobs + 1] = f
    if seen and seen[f] then
      blobs[#blobs + 1] = 1
    else
      local c, what = chain(f)
      if not c then return CORRUPT, 4, what end
      for _, v in ipairs(c) do size = size + (type(v) == 'table' and v[2] or #v) end
      if seen then seen[f] = true end
      blobs[#blobs + 1] = c
    end
  end
  -- The pending writes are checked by the client (here only references are resolved).
  local raw, in_writes = writes_of(member, entry and record)
  local writes = resolve_writes(raw)
  if not writes then return CORRUPT, 4, 'shared-value' end
  local where_w = 5
  if entry then
    if not in_writes then where_w = 3 end
    record = with_writes(record, nil)
  end
  return {member, record, blobs, writes, entry and 3 or 2, where_w}, size + #writes
end
