-- cron_advance.lua: a cron's tick was fired (its run created): move the cron to its next tick, if
-- no one did already. A compare-and-set on the tick: the cron moves only if its due is still the
-- tick the caller fired, so of any number of tickers (serve processes) that fired the same tick,
-- one moves it and the others are told it moved; a ticker that crashed before this call leaves the
-- tick due, and the next one fires it again (its run's id is the tick's: no second run, see
-- server/_crons.py), then moves it.
--   KEYS[1..3] - cron:<cron_id>, crondue, crons (see cron_put.lua)
--   ARGV[1]    - cron id
--   ARGV[2]    - the tick fired: its due ms
--   ARGV[3]    - the next tick's due ms, '' for none (the cron ended: past its end_time)
-- Returns {REPLY_DONE} moved; {REPLY_DONE_BEFORE} the cron was moved from this tick already (by
-- this very call before its reply was lost, or by another ticker that fired it): nothing written;
-- {REPLY_REFUSED, 'missing'} no such cron (deleted); {REPLY_REFUSED, 'moved'} its due is another
-- tick (an update rescheduled it): nothing written.
local id, fired, nxt = ARGV[1], ARGV[2], ARGV[3]
local h = redis.call('HMGET', KEYS[1], 'body', 'due', 'last')
if not h[1] then return {REPLY_REFUSED, 'missing'} end
if h[2] ~= fired then
  if h[3] == fired then return {REPLY_DONE_BEFORE} end
  return {REPLY_REFUSED, 'moved'}
end
redis.call('HSET', KEYS[1], 'due', nxt, 'last', fired)
if nxt == '' then
  redis.call('ZREM', KEYS[2], id)
else
  redis.call('ZADD', KEYS[2], tonumber(nxt), id)
end
return {REPLY_DONE}
