-- pool_next_event_sequence.lua: the pool's next event number (1, 2, 3, ...).
--   KEYS[1..10] - the pool's keys (see _pool.lua)
--   ARGV[1]     - the call's nonce ('' or absent: none)
-- No record is appended (as in the seed). KEYS[1]'s 'evtids' keeps the numbers the latest
-- EVT_IDS calls got, as '<nonce>:<n>;' entries, newest last: a re-send after a lost reply gets
-- its number again instead of taking the next one (every number is given once, none skipped).
-- Returns {POOL_NOT_OPEN}; {POOL_DONE, n}.
local EVT_IDS = 16
local nonce = ARGV[1] or ''
if not is_open() then return { POOL_NOT_OPEN } end
if nonce == '' then return { POOL_DONE, redis.call('HINCRBY', KEYS[1], 'evt', 1) } end
local ring = redis.call('HGET', KEYS[1], 'evtids') or ''
local at = string.find(';' .. ring, ';' .. nonce .. ':', 1, true)
local given = at and string.match(ring, '^(%d+);', at + #nonce + 1)
if given then return { POOL_DONE, tonumber(given) } end
local n = redis.call('HINCRBY', KEYS[1], 'evt', 1)
ring = ring .. nonce .. ':' .. fmt(n) .. ';'
local _, kept = string.gsub(ring, ';', ';')
for _ = EVT_IDS + 1, kept do ring = string.sub(ring, string.find(ring, ';', 1, true) + 1) end
redis.call('HSET', KEYS[1], 'evtids', ring)
return { POOL_DONE, n }
