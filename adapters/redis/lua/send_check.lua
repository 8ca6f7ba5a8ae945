-- send_check.lua: step 1 of a send, on the sender's slot: may this sender send now?
-- KEYS[1] sender registration hash   KEYS[2] sender rate-limit hash (token bucket: tokens, ts)
-- ARGV[1] sender session ("" = do not check)   ARGV[2] send rate per second (0 = unlimited)
-- ARGV[3] burst (bucket size)
-- Checks the registration and session, then takes one rate token. Step 2 (send_append.lua, on the
-- recipient's slot) stores the envelope; when it refuses, send_refund.lua gives the token back.
-- Returns the sender's tier label. Errors (nothing written): RELAY_UNREGISTERED, RELAY_SUPERSEDED,
-- RELAY_SESSION_UNREGISTERED (_session.lua), RELAY_RATE_LIMITED <retry ms>.
local sender = redis.call('HMGET', KEYS[1], 'tier', 'session', 'superseded')
local refused = session_refusal(sender[2], sender[3], ARGV[1])
if refused then
  return refused
end
local rate = tonumber(ARGV[2])
if rate > 0 then
  local burst = math.max(tonumber(ARGV[3]), 1)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local bucket = redis.call('HMGET', KEYS[2], 'tokens', 'ts')
  local tokens = tonumber(bucket[1]) or burst
  local last = tonumber(bucket[2]) or now
  tokens = math.min(burst, tokens + math.max(0, now - last) * rate / 1000)
  if tokens < 1 then
    return redis.error_reply('RELAY_RATE_LIMITED ' .. math.ceil((1 - tokens) * 1000 / rate))
  end
  redis.call('HSET', KEYS[2], 'tokens', tostring(tokens - 1), 'ts', now)
  redis.call('PEXPIRE', KEYS[2], math.ceil(burst * 1000 / rate) + 1000)
end
return sender[1]
