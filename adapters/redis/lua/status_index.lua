-- status_index.lua: which of these envelopes did the caller send, and to whom? On the caller's slot.
-- Built by adapters/redis/protocol_inbox.py (status_index_call).
local registration = KEYS[1] -- caller registration hash
local retired = KEYS[2] -- the caller's retirement (retire.lua); KEYS[3..] its status index hashes (one per day)
local session = ARGV[1] -- "" = do not check
local first_envelope = 2
-- ARGV[2..] per envelope: nonce, then the KEYS positions of the two days it may be noted under (a send
-- is noted under its sender's day, which may differ from the day of the stream entry id by the
-- clocks' skew), as "<i> <j>"
-- Returns per envelope the index value "<recipient> <sent_at ms>", or '' when the caller did not send
-- it (or its day's index expired). Errors: RELAY_RETIRED, RELAY_UNREGISTERED, RELAY_SUPERSEDED,
-- RELAY_SESSION_UNREGISTERED (_session.lua).
local registered = redis.call('HMGET', registration, 'session', 'superseded')
local refused = session_refusal(registered[1], registered[2], session, retired)
if refused then
  return refused
end
local out = {}
for i = first_envelope, #ARGV, 2 do
  local nonce = ARGV[i]
  local found = false
  for position in string.gmatch(ARGV[i + 1], '%d+') do
    found = found or redis.call('HGET', KEYS[tonumber(position)], nonce)
  end
  out[#out + 1] = found or ''
end
return out
