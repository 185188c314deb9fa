-- reshard_lease.lua: the mover's lease on a namespace's reshard (core/reshard.py, "The fenced mover").
--   KEYS[1]    - ns:{ns#layout}:reshard  hash    token, holder, expires (server ms), gen
--   KEYS[2]    - ns:{ns#layout}:fence    string  the generation of the mover that may write the
--                layout record (reshard_record.lua reads it); all in the record's slot
--   ARGV[1]    - action: 'take', 'renew' or 'release'
--   ARGV[2]    - token: the mover's own (a fresh random id per reshard call)
--   ARGV[3]    - holder: who the mover is (host and pid), for the error a second mover gets
--   ARGV[4]    - lease ms
-- take: granted when the lease is this token's already (a re-sent take), or lapsed, or never
-- held: a new generation (gen + 1, never reused) is the mover's fencing token, written to the
-- record's fence here and to every other slot's fence by reshard_fence.lua before anything
-- moves. Refused while another token's lease runs. renew: extends this token's lease while the
-- record's fence still holds its generation. release: ends this token's lease (expires 0), so a
-- next reshard need not wait for it to lapse.
-- Returns {granted 1|0, gen, holder, expires ms, now ms} of the lease as stored after the call.
local lease, fence = KEYS[1], KEYS[2]
local action, token, holder, lease_ms = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local now = server_now_ms()
local stored = redis.call('HMGET', lease, 'token', 'holder', 'expires', 'gen')
local mine = stored[1] == token
local gen = tonumber(stored[4] or '0')
local expires = tonumber(stored[3] or '0')
local function answer(granted)
  local now_holder = redis.call('HGET', lease, 'holder') or ''
  local now_expires = tonumber(redis.call('HGET', lease, 'expires') or '0')
  return {granted, gen, now_holder, now_expires, now}
end
if action == 'take' then
  if not mine then
    if stored[1] and expires > now then
      return answer(0)
    end
    gen = gen + 1
    redis.call('HSET', lease, 'token', token, 'holder', holder, 'gen', fmt(gen))
    redis.call('SET', fence, fmt(gen))
  end
  redis.call('HSET', lease, 'expires', fmt(now + lease_ms))
  return answer(1)
end
if not mine then
  return answer(0)
end
if action == 'renew' then
  if redis.call('GET', fence) ~= fmt(gen) then
    return answer(0)
  end
  redis.call('HSET', lease, 'expires', fmt(now + lease_ms))
else
  redis.call('HSET', lease, 'expires', '0')
end
return answer(1)
