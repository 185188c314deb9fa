-- lg_run_emit.lua: a running run's events, fenced by its attempt's token; answers whether the run
-- was asked to stop (the worker checks at every event and super-step boundary, at no extra cost).
--   KEYS[1] - lgr:<tid>\0<run_id>   the run's hash (see _lgrun.lua)
--   KEYS[2] - lgre:<tid>\0<run_id>  its events
--   ARGV[1] - token of the attempt
--   ARGV[2] - cap: events kept per run (XADD MAXLEN)
--   ARGV[3..] - events, three strings each: event (the stream mode), type, data
-- Returns {REPLY_DONE, cancel ('', 'interrupt' or 'rollback'), id of each event added};
-- {REPLY_REFUSED, 'lost'}: the token no longer runs it (taken over, or ended): nothing written.
local token, cap = ARGV[1], ARGV[2]

local h = redis.call('HMGET', KEYS[1], 'token', 'status', 'cancel')
if not h[1] or h[1] ~= token or h[2] ~= 'running' then return {REPLY_REFUSED, 'lost'} end
local out = {REPLY_DONE, h[3] or ''}
for i = 3, #ARGV - 2, 3 do
  out[#out + 1] = redis.call('XADD', KEYS[2], 'MAXLEN', cap, '*', 'event', ARGV[i], 'type', ARGV[i + 1],
    'data', ARGV[i + 2])
end
return out
