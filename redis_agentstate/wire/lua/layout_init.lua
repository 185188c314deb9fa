-- layout_init.lua: give a namespace its layout record unless it has one; every client then reads
-- the same shard count and tags (keys.py, "Layouts"; wire/layout.py reads and checks it).
--   KEYS[1]    - ns:{ns#layout}:layout  string  '<layout> <shards>', e.g. 'slots 64'
--   ARGV[1]    - layout: the record to write when there is none ('slots <n>', or 'legacy 64' for
--                a namespace whose data predates its layout record)
-- First writer wins: a record already there is kept as it is, whatever it says (a client that
-- asked for another count learns it from the reply and refuses, ConfigConflict). Returns the
-- record as stored after the call; a key of another Redis type fails with WRONGTYPE before
-- anything is written.
local layout = ARGV[1]

local stored = redis.call('GET', KEYS[1])
if stored then
  return stored
end
redis.call('SET', KEYS[1], layout)
return layout
