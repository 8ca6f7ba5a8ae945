-- dead_letter.lua: move one delivered envelope from an inbox to the agent's dead-letter stream.
-- Built by adapters/redis/protocol_delivery.py (dead_letter_call).
local inbox = KEYS[1] -- inbox stream
local dead = KEYS[2] -- dead-letter stream
local outcomes = KEYS[3] -- outcome hash of the day (the sender's status)
local history = KEYS[4] -- the agent's history stream
local at = KEYS[5] -- the history positions hash
local group = ARGV[1] -- consumer group
local id = ARGV[2] -- stream entry id
local nonce = ARGV[3]
local holder = ARGV[4] -- consumer that must hold it ('' = any)
local reason = ARGV[5]
local dead_at = ARGV[6] -- ISO-8601 UTC, as dead letters store it
local until_ms = ARGV[7] -- when the outcome record expires (ms since the epoch; 0 = no record)
local keep_ms = ARGV[8] -- history retention (ms; 0 = keep no history)
local max_bytes = ARGV[9] -- the history's field bytes at most (0 = no cap)
-- The entry must exist, carry the nonce and be pending (delivered, not acknowledged). The dead letter
-- keeps every readable field except the nonce (the envelope id has it) and adds envelope_id, attempts
-- (the delivery count), reason and dead_at; then the entry is XACKed and XDELed. One script, so the
-- envelope is always in exactly one of the two streams (and kept in the history, entry_archive).
-- Returns the attempts recorded, or 0 when nothing was moved.
local found = redis.call('XRANGE', inbox, id, id)[1]
if not found or entry_field(found[2], 'nonce') ~= nonce then
  return 0
end
local row = redis.call('XPENDING', inbox, group, id, id, 1)[1]
if not row or (holder ~= '' and row[2] ~= holder) then
  return 0
end
entry_dead(inbox, dead, group, found, row[4], reason, dead_at, outcomes, until_ms, history, at, keep_ms, max_bytes)
return row[4]
