-- summary.lua: the scalar fields of some tasks of one shard, without their
-- histories (read-only; `agentstate list` and `stats`).
--   KEYS[1..] - checkpoints: KEYS[1] of the task's keys (see _common.lua), of
--               tasks of one shard
-- Returns {now, <SUMMARY_STRIDE entries per key>}, now in server ms; per key
--   'ok', status, cycle, rev, token, claimed, lease, term,
--         att, parked, why, due, prio                      as stored ('' when absent)
--   'missing'                                                no such task (deleted since it was listed)
--   'corrupt', what                                          data this library would not have written
-- each padded with '' to SUMMARY_STRIDE entries. One corrupt task does not
-- hide the others: it is a row of its own.
local SUMMARY_STRIDE = 13
local out = { fmt(server_now_ms()) }
local n = 1
for i = 1, #KEYS do
  local h = redis.pcall('HMGET', KEYS[i], unpack(HASH_FIELDS, 1, 7))
  local kind, what = 'ok', nil
  if h.err then
    kind, what = 'corrupt', h.err
  elseif not present(h) then
    kind = 'missing'
  else
    -- Attempts, parked, last failure (HASH_FIELDS 10..12), the due time (14) and the priority (15):
    -- never the body.
    local p = redis.call('HMGET', KEYS[i], HASH_FIELDS[10], HASH_FIELDS[11], HASH_FIELDS[12], HASH_FIELDS[14],
      HASH_FIELDS[15])
    local bad = bad_field(h) or bad_parking(p[1], p[2])
    if not bad and p[4] and p[4] ~= '' and not int_in(p[4], 0, MAX_REVISION) then bad = 'due' end
    if not bad and p[5] and p[5] ~= '' and not priority_of(p[5]) then bad = 'prio' end
    if bad then kind, what = 'corrupt', 'malformed ' .. bad end
    for j = 1, 5 do h[7 + j] = p[j] end
  end
  out[n + 1] = kind
  for j = 1, SUMMARY_STRIDE - 1 do
    if kind == 'ok' then
      out[n + 1 + j] = h[j] or ''
    elseif j == 1 and what then
      out[n + 1 + j] = what
    else
      out[n + 1 + j] = ''
    end
  end
  n = n + SUMMARY_STRIDE
end
return out
