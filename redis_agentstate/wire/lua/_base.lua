-- _base.lua: prelude shared by every script, after the constants rendered by
-- wire/scripts.py and before the script family's own prelude (see scripts.PRELUDES).

-- Numbers: revisions stay below 2^53 and are exact in Lua 5.1 doubles;
-- string.format('%d') avoids tostring()'s exponent notation.
local function fmt(n)
  return string.format('%d', n)
end

-- TIME is read once per script: Valkey freezes it for the whole script,
-- Redis 7 does not, and reading it twice could disagree with itself.
local function server_now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The id in ``key`` after its kind segment ``marker`` (e.g. '}:cp:'): ids
-- come last and verbatim, and the namespace holds no braces, so the first
-- '}' closes the shard tag (keys.py).
local function id_after(key, marker)
  local i = string.find(key, marker, 1, true)
  return string.sub(key, i + #marker)
end

-- Data this library did not write: the error reply
-- 'AGENTSTATE_CORRUPT <KEYS index> <field>', which the client turns into a
-- CorruptState naming the key and its owner (wire/).
local function corrupt(i, what)
  return redis.error_reply('AGENTSTATE_CORRUPT ' .. i .. ' ' .. what)
end
