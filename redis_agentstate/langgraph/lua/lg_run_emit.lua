-- lg_run_emit.lua: a running run's events, fenced by its attempt's token; answers whether the run
-- was asked to stop (the worker checks at every event and super-step boundary, at no extra cost).
--   KEYS[1] - lgr:<tid>\0<run_id>   the run's hash (see _lgrun.lua)
--   KEYS[2] - lgre:<tid>\0<run_id>  its events
--   ARGV[1] - token of the attempt
--   ARGV[2] - cap: events kept per run (XADD MAXLEN)
--   ARGV[3] - seq: this emit's number in its attempt (1, 2, ...; lg_run_begin.lua resets the count)
--   ARGV[4..] - events, three strings each: event (the stream mode), type, data
-- An emit whose seq is not above the attempt's last ('eseq') applied already (its reply was lost
-- and the client re-sent it): its events are not appended again.
-- Returns {REPLY_DONE, cancel ('', 'interrupt' or 'rollback'), id of each event added};
-- {REPLY_DONE_BEFORE, cancel}: a re-send, nothing written;
-- {REPLY_REFUSED, 'lost'}: the token no longer runs it (taken over, or ended): nothing written.
local token, cap, seq = ARGV[1], ARGV[2], tonumber(ARGV[3])

local h = redis.call('HMGET', KEYS[1], 'token', 'status', 'cancel', 'eseq')
if not h[1] or h[1] ~= token or h[2] ~= 'running' then return {REPLY_REFUSED, 'lost'} end
if seq <= (tonumber(h[4] or '0') or 0) then return {REPLY_DONE_BEFORE, h[3] or ''} end
redis.call('HSET', KEYS[1], 'eseq', ARGV[3])
local out = {REPLY_DONE, h[3] or ''}
for i = 4, #ARGV - 2, 3 do
  out[#out + 1] = redis.call('XADD', KEYS[2], 'MAXLEN', cap, '*', 'event', ARGV[i], 'type', ARGV[i + 1],
    'data', ARGV[i + 2])
end
return out
