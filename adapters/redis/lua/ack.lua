-- ack.lua: acknowledge and delete delivered envelopes of the caller's own inbox.
-- KEYS[1] registration hash   KEYS[2] inbox stream
-- ARGV[1] session ("" = do not check)   ARGV[2] consumer group
-- ARGV[3..] stream entry id, nonce pairs (decoded from envelope ids)
-- An entry is acknowledged only if it exists, its nonce matches and it was delivered (XACK says 1);
-- it is then deleted (XDEL), so acknowledged envelopes never accumulate.
-- Returns per pair {from, tier} of the envelope when acknowledged, or 0 when unknown.
-- Errors: RELAY_UNREGISTERED, RELAY_SUPERSEDED.
local registered = redis.call('HGET', KEYS[1], 'session')
if not registered then
  return redis.error_reply('RELAY_UNREGISTERED')
end
if ARGV[1] ~= '' and registered ~= ARGV[1] then
  return redis.error_reply('RELAY_SUPERSEDED')
end
local out = {}
for i = 3, #ARGV, 2 do
  local id, nonce = ARGV[i], ARGV[i + 1]
  local fields = entry_with_nonce(KEYS[2], id, nonce)
  local result = 0
  if fields and redis.call('XACK', KEYS[2], ARGV[2], id) == 1 then
    redis.call('XDEL', KEYS[2], id)
    result = {entry_field(fields, 'from') or '', entry_field(fields, 'tier') or 'network'}
  end
  out[#out + 1] = result
end
return out
