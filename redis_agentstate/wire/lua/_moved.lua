-- _moved.lua: prelude of every script of a shard's data (tasks, limiters, KV, pools, LangGraph
-- threads), after _base.lua: a shard that a reshard is moving, or moved, refuses every script.
--   <prefix of KEYS[1]>moved   string  'sealed' while a reshard copies the shard to its new
--                                      shards, 'moved' after (keys.py, "Resharding")
-- The seal shares KEYS[1]'s hash tag (the prefix up to '}:'), so it is in the script's slot;
-- it is derived here rather than passed, so that no script's KEYS contract changes.
-- A script that only reads (scripts.READS: SEALED_READS is true for it) runs on a sealed shard,
-- whose data stays whole and current until the reshard marks it moved; every other script, and
-- every script once the shard moved, returns the error reply 'AGENTSTATE_MOVED <sealed|moved>'
-- before anything is read or written:
-- the client re-reads the layout record and sends the same call (same arguments, same nonce)
-- to where the keys live now (wire/relocation.py).
if #KEYS > 0 then
  local tag_end = string.find(KEYS[1], '}:', 1, true)
  if tag_end then
    local seal = redis.call('GET', string.sub(KEYS[1], 1, tag_end + 1) .. 'moved')
    if seal and not (SEALED_READS and seal == 'sealed') then
      return redis.error_reply('AGENTSTATE_MOVED ' .. seal)
    end
  end
end
