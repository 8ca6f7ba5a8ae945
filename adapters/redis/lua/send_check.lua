-- send_check.lua: step 1 of a send, on the sender's slot: may this sender send now?
-- Built by adapters/redis/protocol.py (send_call), which reads the reply (SendChecked).
local registration = KEYS[1] -- sender registration hash
local bucket_key = KEYS[2] -- sender rate-limit hash (token bucket: tokens, ts)
local day_index = KEYS[3] -- the sender's status index of the day (hash: nonce -> "<recipient> <sent_at ms>")
local retired = KEYS[4] -- the sender's retirement (retire.lua), read only when it has no registration
local claim_key = KEYS[5] -- the idempotency claim (string: request hash), only when request_hash is not ''
local session = ARGV[1] -- sender session ("" = do not check)
local rate = tonumber(ARGV[2]) -- send rate per second (0 = unlimited)
local burst_arg = ARGV[3] -- burst (bucket size)
local request_hash = ARGV[4] -- '' = no idempotency key
local window_ms = ARGV[5] -- dedup window in ms
local nonce = ARGV[6]
local index_value = ARGV[7] -- status index value
local index_until = ARGV[8] -- when the status index expires (ms since the epoch; 0 = keep no status)
-- Checks the registration and session, then the idempotency claim: a claim with another hash is a
-- conflict; a claim with the same hash is a repeat, which takes no rate token and writes nothing (step 2
-- answers it from its record). Otherwise claims the key, takes one rate token and notes the nonce in
-- the status index. Step 2 (send_append.lua, on the recipient's slot) stores the envelope; when it
-- refuses, send_refund.lua undoes this step.
-- Returns {sender's tier label, repeat (1|0), the bucket size send_refund.lua gives the token back
-- with ('0': no token was taken), sender's provider (send_append.lua's contact policy reads it)}.
-- Errors (nothing written): RELAY_RETIRED, RELAY_UNREGISTERED, RELAY_SUPERSEDED, RELAY_SESSION_UNREGISTERED
-- (_session.lua), RELAY_IDEMPOTENCY_CONFLICT, RELAY_RATE_LIMITED <retry ms>.
local sender = redis.call('HMGET', registration, 'tier', 'session', 'superseded', 'provider')
local refused = session_refusal(sender[2], sender[3], session, retired)
if refused then
  return refused
end
if request_hash ~= '' then
  local claimed = redis.call('GET', claim_key)
  if claimed then
    if claimed ~= request_hash then
      return redis.error_reply('RELAY_IDEMPOTENCY_CONFLICT')
    end
    return {sender[1], 1, '0', sender[4] or ''}
  end
end
local refund = '0'
if rate > 0 then
  local burst = math.max(tonumber(burst_arg), 1)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local bucket = redis.call('HMGET', bucket_key, 'tokens', 'ts')
  local tokens = tonumber(bucket[1]) or burst
  local last = tonumber(bucket[2]) or now
  tokens = math.min(burst, tokens + math.max(0, now - last) * rate / 1000)
  if tokens < 1 then
    return redis.error_reply('RELAY_RATE_LIMITED ' .. math.ceil((1 - tokens) * 1000 / rate))
  end
  redis.call('HSET', bucket_key, 'tokens', tostring(tokens - 1), 'ts', now)
  redis.call('PEXPIRE', bucket_key, math.ceil(burst * 1000 / rate) + 1000)
  refund = burst_arg
end
if request_hash ~= '' then
  redis.call('SET', claim_key, request_hash, 'PX', window_ms)
end
if index_until ~= '0' then
  redis.call('HSET', day_index, nonce, index_value)
  redis.call('PEXPIREAT', day_index, index_until)
end
return {sender[1], 0, refund, sender[4] or ''}
