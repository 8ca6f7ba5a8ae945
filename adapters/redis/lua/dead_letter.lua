-- dead_letter.lua: move one delivered envelope from an inbox to the agent's dead-letter stream.
-- KEYS[1] inbox stream   KEYS[2] dead-letter stream   KEYS[3] outcome hash of the day (the sender's status)
-- ARGV[1] consumer group   ARGV[2] stream entry id   ARGV[3] nonce
-- ARGV[4] consumer that must hold it ('' = any)   ARGV[5] reason   ARGV[6] dead_at (ISO-8601 UTC)
-- ARGV[7] when the outcome record expires (ms since the epoch; 0 = no record)
-- The entry must exist, carry the nonce and be pending (delivered, not acknowledged). The dead letter
-- keeps every readable field except the nonce (the envelope id has it) and adds envelope_id, attempts
-- (the delivery count), reason and dead_at; then the entry is XACKed and XDELed. One script, so the
-- envelope is always in exactly one of the two streams.
-- Returns the attempts recorded, or 0 when nothing was moved.
local group, id, nonce = ARGV[1], ARGV[2], ARGV[3]
local found = redis.call('XRANGE', KEYS[1], id, id)[1]
if not found or entry_field(found[2], 'nonce') ~= nonce then
  return 0
end
local row = redis.call('XPENDING', KEYS[1], group, id, id, 1)[1]
if not row or (ARGV[4] ~= '' and row[2] ~= ARGV[4]) then
  return 0
end
entry_dead(KEYS[1], KEYS[2], group, found, row[4], ARGV[5], ARGV[6], KEYS[3], ARGV[7])
return row[4]
