-- dead_letter.lua: move one delivered envelope from an inbox to the agent's dead-letter stream.
-- KEYS[1] inbox stream   KEYS[2] dead-letter stream
-- ARGV[1] consumer group   ARGV[2] stream entry id   ARGV[3] nonce   ARGV[4] envelope id
-- ARGV[5] consumer that must hold it ('' = any)   ARGV[6] reason   ARGV[7] dead_at (ISO-8601 UTC)
-- The entry must exist, carry the nonce and be pending (delivered, not acknowledged). The dead letter
-- keeps every readable field except the nonce (the envelope id has it) and adds envelope_id, attempts
-- (the delivery count), reason and dead_at; then the entry is XACKed and XDELed. One script, so the
-- envelope is always in exactly one of the two streams.
-- Returns the attempts recorded, or 0 when nothing was moved.
local group, id, nonce = ARGV[1], ARGV[2], ARGV[3]
local found = redis.call('XRANGE', KEYS[1], id, id)[1]
if not found then
  return 0
end
local row = redis.call('XPENDING', KEYS[1], group, id, id, 1)[1]
if not row or (ARGV[5] ~= '' and row[2] ~= ARGV[5]) then
  return 0
end
local fields = found[2]
local entry = {'envelope_id', ARGV[4]}
local matches = false
for j = 1, #fields - 1, 2 do
  if fields[j] == 'nonce' then
    matches = fields[j + 1] == nonce
  else
    entry[#entry + 1] = fields[j]
    entry[#entry + 1] = fields[j + 1]
  end
end
if not matches then
  return 0
end
local attempts = row[4]
entry[#entry + 1] = 'attempts'
entry[#entry + 1] = attempts
entry[#entry + 1] = 'reason'
entry[#entry + 1] = ARGV[6]
entry[#entry + 1] = 'dead_at'
entry[#entry + 1] = ARGV[7]
redis.call('XADD', KEYS[2], '*', unpack(entry))
redis.call('XACK', KEYS[1], group, id)
redis.call('XDEL', KEYS[1], id)
return attempts
