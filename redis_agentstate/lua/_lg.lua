-- _lg.lua: prelude of every LangGraph-thread script (see redis_agentstate/langgraph/_core.py).
--
-- Every script takes the keys of one thread, in this order (keys.ThreadKeys; all
-- in the slot of the thread's shard, so a script runs unchanged on Redis Cluster):
--   KEYS[1]  lgmeta:<tid>   hash  holder, exp: the thread's lease (absent when free)
--   KEYS[2]  lgcp:<tid>     hash  <ns>\0<cid> -> '<n>:' + the n bytes of the blob fields the
--                                   checkpoint reads (each '<len>:<field>') + its record (opaque)
--   KEYS[3]  lgidx:<tid>    zset  <ns>\0<cid>, score 0: lex order is id order
--   KEYS[4]  lgblob:<tid>   hash  <ns>\0<channel>\0<version> -> 'F'<value> or a tail (below)
--   KEYS[5]  lgw:<tid>      hash  <ns>\0<cid> -> the checkpoint's pending writes, packed: one
--                                   '<n>:<task_id>\0<idx><m>:<write>' per write (n, m: lengths)
--   KEYS[6]  lgrun:<tid>    zset  <run_id>\0<ns>\0<cid>, score 0
--   KEYS[7]  lgrel:<tid>    list  release notices for lease waiters
--   KEYS[8]  lgthreads      zset  thread ids of the shard, score 0
--   KEYS[9]  lgruns         zset  <run_id>\0<tid> of the shard, score 0
--
-- A tail blob 'T<n>:<base version><value>' holds the items a list channel gained
-- since version <base version> of the same channel; readers rebuild the list from
-- the chain of bases down to a full value. No id the library stores contains NUL.

local SEP = '\0'

-- Fail with WRONGTYPE before the first write if any key is of another Redis type
-- (the driver then names the key).
local function probe()
  for _, key in ipairs({ KEYS[1], KEYS[2], KEYS[4], KEYS[5] }) do redis.call('HLEN', key) end
  for _, key in ipairs({ KEYS[3], KEYS[6], KEYS[8], KEYS[9] }) do redis.call('ZCARD', key) end
  redis.call('LLEN', KEYS[7])
end

-- '' when the caller may write: token holds a live lease on the thread, or token is ''
-- and no live lease is held. 'busy': a live lease is held and the caller holds none.
-- 'lost': the caller's token no longer holds a live lease (it expired on the server
-- clock, whether or not another writer has taken the thread since).
local function fence(token, now)
  local h = redis.call('HMGET', KEYS[1], 'holder', 'exp')
  if token == '' then
    if h[1] and (tonumber(h[2]) or 0) > now then return 'busy' end
    return ''
  end
  if h[1] ~= token or (tonumber(h[2]) or 0) <= now then return 'lost' end
  return ''
end

-- True while somebody holds a live lease on the thread.
local function leased(now)
  local h = redis.call('HMGET', KEYS[1], 'holder', 'exp')
  return h[1] ~= false and h[1] ~= nil and (tonumber(h[2]) or 0) > now
end

-- Expiry of every data key of the thread (not the lease: it has its own).
local function touch(ttl)
  if ttl == '' then return end
  for i = 2, 6 do redis.call('PEXPIRE', KEYS[i], ttl) end
end

local function split_fields(list)
  local out, i = {}, 1
  while i <= #list do
    local c = string.find(list, ':', i, true)
    local n = tonumber(string.sub(list, i, c - 1))
    out[#out + 1] = string.sub(list, c + 1, c + n)
    i = c + n + 1
  end
  return out
end

-- The '<len>:<field>' list of blob fields a stored checkpoint reads (the prefix of its value).
local function reads_of(record)
  local c = string.find(record, ':', 1, true)
  return string.sub(record, c + 1, c + tonumber(string.sub(record, 1, c - 1)))
end

-- The blob field of the base of tail value v stored at field f, or nil for a full value.
local function base_of(f, v)
  if string.sub(v, 1, 1) ~= 'T' then return nil end
  local c = string.find(v, ':', 2, true)
  local n = tonumber(string.sub(v, 2, c - 1))
  local version = string.sub(v, c + 1, c + n)
  local last = 0
  while true do
    local j = string.find(f, SEP, last + 1, true)
    if not j then break end
    last = j
  end
  return string.sub(f, 1, last) .. version
end

-- The stored values of blob field f, newest first: a tail chain ends at a full value
-- (or at a missing base, which the reader reports as corrupt).
local MAX_CHAIN = 4096
-- What checkpoint_reply answers for a tail chain that never ends (the script then replies
-- corrupt_chain(), an error reply naming KEYS[4]; see _ops.CORRUPT_REPLY).
local LOOPED = 'looped'

local function corrupt_chain()
  return redis.error_reply('AGENTSTATE_CORRUPT 4 tail-chain')
end

local function chain(f)
  local out = {}
  local v = redis.call('HGET', KEYS[4], f)
  while v do
    out[#out + 1] = v
    f = base_of(f, v)
    if not f then break end
    -- The library's chains are at most 2 * TAIL_CHAIN long; a loop is data it did not write.
    if #out > MAX_CHAIN then return nil end
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

-- The writes of a packed value, as {key, write} pairs in stored order.
local function unpack_writes(s)
  local out, i = {}, 1
  while i <= #s do
    local c = string.find(s, ':', i, true)
    local n = tonumber(string.sub(s, i, c - 1))
    local key = string.sub(s, c + 1, c + n)
    i = c + n + 1
    c = string.find(s, ':', i, true)
    n = tonumber(string.sub(s, i, c - 1))
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

-- Remove checkpoint <ns>\0<cid> and its pending writes (not its blobs: see gc_blobs).
local function drop_checkpoint(member)
  redis.call('HDEL', KEYS[2], member)
  redis.call('ZREM', KEYS[3], member)
  redis.call('HDEL', KEYS[5], member)
end

-- Drop every blob no remaining checkpoint reads (tails keep their bases).
local function gc_blobs()
  local keep = {}
  for _, record in ipairs(redis.call('HVALS', KEYS[2])) do
    for _, f in ipairs(split_fields(reads_of(record))) do
      while f and not keep[f] do
        keep[f] = true
        local v = redis.call('HGET', KEYS[4], f)
        f = v and base_of(f, v)
      end
    end
  end
  local gone = {}
  for _, f in ipairs(redis.call('HKEYS', KEYS[4])) do
    if not keep[f] then gone[#gone + 1] = f end
  end
  hdel_all(KEYS[4], gone)
end

-- Drop the shard's run entries of this thread for runs it no longer has.
local function gc_runs(tid, runs)
  local still = {}
  for _, m in ipairs(redis.call('ZRANGE', KEYS[6], 0, -1)) do
    still[string.sub(m, 1, string.find(m, SEP, 1, true) - 1)] = true
  end
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

-- Everything of the thread but its lease.
local function drop_thread(tid)
  local runs = {}
  for _, m in ipairs(redis.call('ZRANGE', KEYS[6], 0, -1)) do
    runs[string.sub(m, 1, string.find(m, SEP, 1, true) - 1)] = true
  end
  for run in pairs(runs) do redis.call('ZREM', KEYS[9], run .. SEP .. tid) end
  redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6])
  redis.call('ZREM', KEYS[8], tid)
end

-- Checkpoint <ns>\0<cid> with everything a reader needs: {member, record, blobs, writes}
-- (blobs = {field, {value, base value, ...}, ...}, each tail chain newest first;
-- writes = its packed pending writes, '' if none), nil if there is no such checkpoint, or
-- LOOPED if one of its tail chains never ends.
local function checkpoint_reply(member)
  local record = redis.call('HGET', KEYS[2], member)
  if not record then return nil end
  local blobs = {}
  for _, f in ipairs(split_fields(reads_of(record))) do
    local c = chain(f)
    if not c then return LOOPED end
    blobs[#blobs + 1] = f
    blobs[#blobs + 1] = c
  end
  return {member, record, blobs, redis.call('HGET', KEYS[5], member) or ''}
end
