-- pool_watch.lua: one bounded page of the records after a cursor, in order (read-only).
--   KEYS[1..10] - the pool's keys (see _pool.lua)
--   ARGV[1]     - first entry id wanted: '<after + 1>-0'
--   ARGV[2]     - max records to return (>= 1: never the whole log in one script)
-- Returns {POOL_NOT_OPEN}; {POOL_DONE, last_seq, seq, kind, blob, seq, kind, blob, ...}.
-- The client compares the first seq returned with the one it asked for: a
-- higher one means retention trimmed past the cursor (CursorExpired).
local start, count = ARGV[1], tonumber(ARGV[2])

local head = redis.call('HGET', KEYS[1], 'seq')
if not head then return { POOL_NOT_OPEN } end
local entries = redis.call('XRANGE', KEYS[7], start, '+', 'COUNT', count)
local out = { POOL_DONE, head }
local n = 2
for i = 1, #entries do
  local id, fields = entries[i][1], entries[i][2]
  local kind, blob = '', ''
  for j = 1, #fields, 2 do
    if fields[j] == 'k' then kind = fields[j + 1] elseif fields[j] == 'p' then blob = fields[j + 1] end
  end
  out[n + 1] = string.match(id, '^(%d+)-')
  out[n + 2] = kind
  out[n + 3] = blob
  n = n + 3
end
return out
