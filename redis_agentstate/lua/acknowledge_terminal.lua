-- acknowledge_terminal.lua: delete a terminal checkpoint at the expected revision.
--   KEYS[1..7] - the task's keys (see _common.lua)
--   ARGV[1]    - nonce of this call; kept in KEYS[7] for ARGV[3] ms so that a
--                re-send after a lost reply still returns 1
--   ARGV[2]    - expected revision
--   ARGV[3]    - how long the nonce is remembered, in ms
-- Returns 1 deleted (or deleted by this nonce already); 0 otherwise.
local nonce, expected, remember_ms = ARGV[1], tonumber(ARGV[2]), ARGV[3]

local h = redis.call('HMGET', KEYS[1], 'rev', 'term', 'applied')
if h[1] and not int_in(h[1], 0, MAX_REVISION) then return corrupt(1, 'rev') end
probe(2, 3, 4, 5, 7)
-- Checked first: the task may have been created again since our first send.
if was_applied(redis.call('GET', KEYS[7]), nonce) then return 1 end
if not h[1] then return 0 end
if tonumber(h[1]) ~= expected or h[2] ~= '1' then return 0 end
local task_id = task_id_of(KEYS[1])
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
redis.call('ZREM', KEYS[4], task_id)
redis.call('ZREM', KEYS[5], task_id)
-- The tombstone keeps the task's write ring, so a re-sent commit/finalize is still recognised.
redis.call('SET', KEYS[7], remember(h[3], nonce), 'PX', remember_ms)
return 1
