-- cron_put.lua: create or update one cron schedule of agentstate serve (langgraph/crons.py).
--   KEYS[1] - cron:<cron_id>  hash: body (the cron's JSON record), due (its next tick, server ms, ''
--             when it has none: disabled or ended), last (the tick last fired, '' before the first)
--   KEYS[2] - crondue         zset: cron id -> due ms (the crons a ticker fires, earliest first)
--   KEYS[3] - crons           zset: cron id -> created ms (every cron, oldest first)
--   (all three in shard 0's slot of the namespace, keys.Keys.crons)
--   ARGV[1] - cron id
--   ARGV[2] - 'create': the cron must not exist; 'update': it must
--   ARGV[3] - body: the JSON record, written as given (the caller stamps its times)
--   ARGV[4] - due: the next tick in server ms, '' for none, 'keep' to leave it as it is (update)
--   ARGV[5] - created ms (the crons index's score; create only)
-- Returns {REPLY_DONE} written; {REPLY_DONE_BEFORE} a create whose cron holds this very body
-- already (a re-send after a lost reply: nothing written); {REPLY_REFUSED, 'exists'} a create of
-- another cron with that id, {REPLY_REFUSED, 'missing'} an update of no cron: nothing written.
-- Everything written comes from the arguments, so an update sent again writes the same values.
local id, mode, body, due = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local held = redis.call('HGET', KEYS[1], 'body')
if mode == 'create' then
  if held then
    if held == body then return {REPLY_DONE_BEFORE} end
    return {REPLY_REFUSED, 'exists'}
  end
  redis.call('HSET', KEYS[1], 'body', body, 'due', '', 'last', '')
  redis.call('ZADD', KEYS[3], tonumber(ARGV[5]), id)
elseif not held then
  return {REPLY_REFUSED, 'missing'}
else
  redis.call('HSET', KEYS[1], 'body', body)
end
if due ~= 'keep' then
  redis.call('HSET', KEYS[1], 'due', due)
  if due == '' then
    redis.call('ZREM', KEYS[2], id)
  else
    redis.call('ZADD', KEYS[2], tonumber(due), id)
  end
end
return {REPLY_DONE}
