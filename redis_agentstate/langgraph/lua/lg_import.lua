-- lg_import.lua: add another thread's dump to this thread (the target side of copy_thread).
--   KEYS[1..9] - the thread's keys (see _lg.lua)
--   ARGV[1]     - thread id
--   ARGV[2]     - lease token of the writer ('' = it holds no lease)
--   ARGV[3]     - ttl in ms for every data key of the thread ('' = none)
--   ARGV[4..7]  - how many ARGV entries each part of the dump takes (records,
--                 blobs, writes: field/value pairs; runs: members)
--   ARGV[8..]   - the parts, in that order (see lg_dump.lua)
-- Returns {DONE} copied (or copied before: the thread holds every checkpoint of the dump as this
-- copy stores it, as after a re-send of a copy whose reply was lost; nothing written);
-- {REFUSED, 'busy'} / {REFUSED, 'lost'} refused by the lease; {REFUSED, 'exists'} the thread
-- already has other checkpoints (a copy never merges two histories); nothing written when refused.
local tid, token, ttl = ARGV[1], ARGV[2], ARGV[3]

probe()
local refused = fence(token, server_now_ms())
if refused ~= '' then return {REPLY_REFUSED, refused} end
local i = 8
local n_records = tonumber(ARGV[4])
if redis.call('ZCARD', KEYS[3]) > 0 then
  for j = i, i + n_records - 1, 2 do
    if not redis.call('ZSCORE', KEYS[3], ARGV[j] .. SEP .. ARGV[j + 1]) then return {REPLY_REFUSED, 'exists'} end
  end
  return {REPLY_DONE}
end
local function pairs_into(n, key, index)
  for j = i, i + n - 1, 2 do
    redis.call('HSET', key, ARGV[j], ARGV[j + 1])
    if index then redis.call('ZADD', index, 0, ARGV[j]) end
  end
  i = i + n
end
for j = i, i + n_records - 1, 2 do put_record(ARGV[j], ARGV[j + 1], nil) end
i = i + n_records
pairs_into(tonumber(ARGV[5]), KEYS[4], nil)
pairs_into(tonumber(ARGV[6]), KEYS[5], nil)
for j = i, i + tonumber(ARGV[7]) - 1 do
  local m = ARGV[j]
  redis.call('ZADD', KEYS[6], 0, m)
  redis.call('ZADD', KEYS[9], 0, string.sub(m, 1, string.find(m, SEP, 1, true) - 1) .. SEP .. tid)
end
if n_records > 0 then redis.call('ZADD', KEYS[8], 0, tid) end
touch(ttl)
return {REPLY_DONE}
