-- lg_list.lua: one page of a thread's checkpoints, newest first.
--   KEYS[1..9] - the thread's keys (see _lg.lua)
--   ARGV[1]    - upper bound, a ZREVRANGEBYLEX max ('+', '(<member>', ...)
--   ARGV[2]    - lower bound, a ZREVRANGEBYLEX min
--   ARGV[3]    - page size
--   ARGV[4]    - '1': whole checkpoints (a listing without a metadata filter reads every one);
--                '0': records only (the caller filters on metadata, then reads the matches)
--   ARGV[5]    - thread id
--   ARGV[6]    - byte budget of a whole-checkpoint page: the page ends before a checkpoint whose
--                new values (those the page does not carry yet) would take it past this many
--                bytes (after one checkpoint at least), so no call reads without bound whatever
--                the thread holds; '' or 0: none
--   ARGV[7..]  - blob fields the reader holds already (the last checkpoint of its previous page
--                reads them): their chains are not sent again
-- A thread without checkpoints (expired with the saver's ttl) is dropped from the shard's
-- thread and run indexes when a listing meets it (housekeeping the next listing would redo).
-- Returns {members, records, the KEYS index each record is in (3, or 2: the layout of earlier
-- versions)} for '0'; {members, checkpoints, cut} for '1', each checkpoint
-- as lg_get returns it (see checkpoint_reply in _lg.lua; a chain the reader has already, earlier
-- in the page or named in ARGV[7..], is the integer 1), cut 1 when the budget ended the page before the members it was asked for (the
-- members returned are those read); an AGENTSTATE_CORRUPT error reply for a malformed
-- checkpoint or blob.
local entries = redis.call('ZREVRANGEBYLEX', KEYS[3], ARGV[1], ARGV[2], 'LIMIT', 0, tonumber(ARGV[3]))
if #entries == 0 then
  if redis.call('ZCARD', KEYS[3]) == 0 and redis.call('ZSCORE', KEYS[8], ARGV[5]) then forget_thread(ARGV[5]) end
  return {{}, {}}
end
local members, stored = {}, {}
for i, e in ipairs(entries) do members[i], stored[i] = split_entry(e) end
if ARGV[4] ~= '1' then
  local records, where = {}, {}
  for i, m in ipairs(members) do
    records[i] = stored[i] or redis.call('HGET', KEYS[2], m) or false
    where[i] = stored[i] and 3 or 2
  end
  return {members, records, where}
end
local budget = tonumber(ARGV[6] or '') or 0
local out, read, seen, used = {}, {}, {}, 0
for i = 7, #ARGV do seen[ARGV[i]] = true end
for i, m in ipairs(members) do
  local room = nil
  if budget > 0 and i > 1 then room = math.max(0, budget - used) end
  -- On success the second value is the bytes the checkpoint carries (on corruption, a KEYS index).
  local reply, k, what = checkpoint_reply(m, seen, room, stored[i])
  if reply == FULL then return {read, out, 1} end
  if reply == CORRUPT then return corrupt(k, what) end
  out[i], read[i] = reply or false, m
  used = used + (reply and k or 0)
end
return {members, out, 0}
