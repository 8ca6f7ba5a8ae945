-- ack.lua: acknowledge and delete delivered envelopes of the caller's own inbox.
-- Built by adapters/redis/protocol_inbox.py (ack_call), which reads the reply (acked).
local registration = KEYS[1] -- registration hash
local inbox = KEYS[2] -- inbox stream
local outcomes = KEYS[3] -- outcome hash of the day (the senders' status)
local history = KEYS[4] -- the agent's history stream
local at = KEYS[5] -- the history positions hash
local session = ARGV[1] -- "" = do not check
local group = ARGV[2] -- consumer group
local until_ms = ARGV[3] -- when outcome records expire (ms since the epoch; 0 = no records)
local keep_ms = ARGV[4] -- history retention (ms; 0 = keep no history)
local max_bytes = ARGV[5] -- the history's field bytes at most (0 = no cap)
local first_pair = 6 -- ARGV[6..]: stream entry id, nonce pairs (decoded from envelope ids)
-- An entry is acknowledged only if it exists, its nonce matches and it was delivered (XACK says 1);
-- it is then deleted (XDEL), so acknowledged envelopes never accumulate, and its outcome is recorded
-- with its delivery count ('acked', _entry.lua) for its sender's status, and the envelope is kept in
-- the agent's history (entry_archive, _entry.lua) in the same script.
-- Returns per pair {from, tier} of the envelope when acknowledged, or 0 when unknown.
-- Records seen_at (note_seen, _session.lua). Works at maxmemory: XACK and XDEL come first, and Redis
-- does not refuse them there (they free memory); the outcome records after them are let through too.
-- Errors: RELAY_UNREGISTERED, RELAY_SUPERSEDED, RELAY_SESSION_UNREGISTERED (_session.lua).
local registered = redis.call('HMGET', registration, 'session', 'superseded')
local refused = session_refusal(registered[1], registered[2], session)
if refused then
  return refused
end
local out, records = {}, {}
local trimmed, now_ms = false, nil -- the history is trimmed by time once per call, at its first entry
for i = first_pair, #ARGV, 2 do
  local id, nonce = ARGV[i], ARGV[i + 1]
  local fields = entry_with_nonce(inbox, id, nonce)
  local result = 0
  if fields then
    local row = redis.call('XPENDING', inbox, group, id, id, 1)[1]
    local count = row and row[4]
    if count and redis.call('XACK', inbox, group, id) == 1 then
      redis.call('XDEL', inbox, id)
      local read = entry_archive(history, at, keep_ms, max_bytes, {id, fields}, count, 'acknowledged', nil, trimmed)
      now_ms, trimmed = now_ms or read, true
      records[#records + 1] = nonce
      records[#records + 1] = id .. ' ' .. count .. ' acked'
      result = {entry_field(fields, 'from') or '', entry_field(fields, 'tier') or 'network'}
    end
  end
  out[#out + 1] = result
end
entry_outcomes(outcomes, until_ms, records)
note_seen(registration, now_ms)
return out
