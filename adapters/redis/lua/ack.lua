-- ack.lua: acknowledge and delete delivered envelopes of the caller's own inbox.
-- Built by adapters/redis/protocol_inbox.py (ack_call), which reads the reply (acked).
local registration = KEYS[1] -- registration hash
local inbox = KEYS[2] -- inbox stream
local outcomes = KEYS[3] -- outcome hash of the day (the senders' status)
local history = KEYS[4] -- the agent's history stream
local at = KEYS[5] -- the history positions hash
local retired = KEYS[6] -- the agent's retirement (retire.lua), read only when it has no registration
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
-- Records seen_at (note_seen, _session.lua). Works at maxmemory (allow-oom), and so does its EVAL form
-- (adapters/redis/scripts.py): XACK and XDEL come first, and Redis does not refuse them there (they
-- free memory); the outcome records after them are let through too.
-- Errors: RELAY_RETIRED, RELAY_UNREGISTERED, RELAY_SUPERSEDED, RELAY_SESSION_UNREGISTERED (_session.lua).
local registered = redis.call('HMGET', registration, 'session', 'superseded')
local refused = session_refusal(registered[1], registered[2], session, retired)
if refused then
  return refused
end
-- Several envelopes: their entries and delivery counts are read with one XRANGE and one XPENDING over
-- the span of their ids, as many rows as ids at most; an id those miss (other entries lie in the span)
-- is read on its own.
local found, counts = nil, nil
local n = math.floor((#ARGV - first_pair + 1) / 2)
if n > 1 then
  local lo, hi = ARGV[first_pair], ARGV[first_pair]
  local lo_ms, lo_seq = string.match(lo, '^(%d+)-(%d+)$')
  lo_ms, lo_seq = tonumber(lo_ms), tonumber(lo_seq)
  local hi_ms, hi_seq = lo_ms, lo_seq
  for i = first_pair + 2, #ARGV, 2 do
    local ms, seq = string.match(ARGV[i], '^(%d+)-(%d+)$')
    ms, seq = tonumber(ms), tonumber(seq)
    if not (ms and lo_ms) then
      lo = nil
      break
    end
    if ms < lo_ms or (ms == lo_ms and seq < lo_seq) then
      lo, lo_ms, lo_seq = ARGV[i], ms, seq
    end
    if ms > hi_ms or (ms == hi_ms and seq > hi_seq) then
      hi, hi_ms, hi_seq = ARGV[i], ms, seq
    end
  end
  if lo then
    found, counts = {}, {}
    for _, e in ipairs(redis.call('XRANGE', inbox, lo, hi, 'COUNT', n)) do
      found[e[1]] = e[2]
    end
    for _, row in ipairs(redis.call('XPENDING', inbox, group, lo, hi, n)) do
      counts[row[1]] = row[4]
    end
  end
end
local out, records = {}, {}
local trimmed, now_ms = false, nil -- the history is trimmed by time once per call, at its first entry
for i = first_pair, #ARGV, 2 do
  local id, nonce = ARGV[i], ARGV[i + 1]
  local fields = found and found[id]
  if not fields then
    fields = entry_with_nonce(inbox, id, nonce)
  elseif entry_field(fields, 'nonce') ~= nonce then
    fields = nil
  end
  local result = 0
  if fields then
    local count = counts and counts[id]
    if not count then
      local row = redis.call('XPENDING', inbox, group, id, id, 1)[1]
      count = row and row[4]
    end
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
