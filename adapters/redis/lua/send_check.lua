-- send_check.lua: step 1 of a send, on the sender's slot: may this sender send now?
-- KEYS[1] sender registration hash   KEYS[2] sender rate-limit hash (token bucket: tokens, ts)
-- KEYS[3] the sender's status index of the day (hash: nonce -> "<recipient> <sent_at ms>")
-- KEYS[4] the idempotency claim (string: request hash), only when ARGV[4] is not ''
-- ARGV[1] sender session ("" = do not check)   ARGV[2] send rate per second (0 = unlimited)
-- ARGV[3] burst (bucket size)   ARGV[4] request hash ('' = no idempotency key)
-- ARGV[5] dedup window in ms   ARGV[6] nonce   ARGV[7] status index value
-- ARGV[8] when the status index expires (ms since the epoch; 0 = keep no status)
-- Checks the registration and session, then the idempotency claim: a claim with another hash is a
-- conflict; a claim with the same hash is a repeat, which takes no rate token and writes nothing (step 2
-- answers it from its record). Otherwise claims the key, takes one rate token and notes the nonce in
-- the status index. Step 2 (send_append.lua, on the recipient's slot) stores the envelope; when it
-- refuses, send_refund.lua undoes this step.
-- Returns {sender's tier label, repeat (1|0), sender's provider (send_append.lua's contact policy reads
-- it)}. Errors (nothing written): RELAY_UNREGISTERED, RELAY_SUPERSEDED, RELAY_SESSION_UNREGISTERED
-- (_session.lua), RELAY_IDEMPOTENCY_CONFLICT, RELAY_RATE_LIMITED <retry ms>.
local sender = redis.call('HMGET', KEYS[1], 'tier', 'session', 'superseded', 'provider')
local refused = session_refusal(sender[2], sender[3], ARGV[1])
if refused then
  return refused
end
if ARGV[4] ~= '' then
  local claimed = redis.call('GET', KEYS[4])
  if claimed then
    if claimed ~= ARGV[4] then
      return redis.error_reply('RELAY_IDEMPOTENCY_CONFLICT')
    end
    return {sender[1], 1, sender[4] or ''}
  end
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
if ARGV[4] ~= '' then
  redis.call('SET', KEYS[4], ARGV[4], 'PX', ARGV[5])
end
if ARGV[8] ~= '0' then
  redis.call('HSET', KEYS[3], ARGV[6], ARGV[7])
  redis.call('PEXPIREAT', KEYS[3], ARGV[8])
end
return {sender[1], 0, sender[4] or ''}
