-- send.lua: check both registrations and append one envelope to the recipient's inbox, atomically.
-- KEYS[1] sender registration hash   KEYS[2] recipient registration hash   KEYS[3] recipient inbox stream
-- KEYS[4] sender rate-limit hash (token bucket: tokens, ts)
-- ARGV[1] sender id   ARGV[2] sender session ("" = do not check)   ARGV[3] sent_at (ISO-8601 UTC)
-- ARGV[4] nonce   ARGV[5] inbox cap (0 = none)   ARGV[6] consumer group name
-- ARGV[7] send rate per second (0 = unlimited)   ARGV[8] burst (bucket size)
-- ARGV[9..] body fields as name, value pairs (the contract's readable fields)
-- Returns {stream entry id, tier label}. Errors (nothing written): RELAY_UNREGISTERED,
-- RELAY_SUPERSEDED, RELAY_UNKNOWN_RECIPIENT, RELAY_INBOX_FULL <cap>, RELAY_RATE_LIMITED <retry ms>.
-- Refused sends do not consume rate tokens.
local rank = {in_process = 1, host = 2, network = 3}
local sender = redis.call('HMGET', KEYS[1], 'tier', 'session')
if not sender[1] then
  return redis.error_reply('RELAY_UNREGISTERED')
end
if ARGV[2] ~= '' and sender[2] ~= ARGV[2] then
  return redis.error_reply('RELAY_SUPERSEDED')
end
local recipient_tier = redis.call('HGET', KEYS[2], 'tier')
if not recipient_tier then
  return redis.error_reply('RELAY_UNKNOWN_RECIPIENT')
end
local cap = tonumber(ARGV[5])
if cap > 0 and redis.call('XLEN', KEYS[3]) >= cap then
  return redis.error_reply('RELAY_INBOX_FULL ' .. ARGV[5])
end
local rate = tonumber(ARGV[7])
if rate > 0 then
  local burst = math.max(tonumber(ARGV[8]), 1)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local bucket = redis.call('HMGET', KEYS[4], 'tokens', 'ts')
  local tokens = tonumber(bucket[1]) or burst
  local last = tonumber(bucket[2]) or now
  tokens = math.min(burst, tokens + math.max(0, now - last) * rate / 1000)
  if tokens < 1 then
    return redis.error_reply('RELAY_RATE_LIMITED ' .. math.ceil((1 - tokens) * 1000 / rate))
  end
  redis.call('HSET', KEYS[4], 'tokens', tostring(tokens - 1), 'ts', now)
  redis.call('PEXPIRE', KEYS[4], math.ceil(burst * 1000 / rate) + 1000)
end
local tier = sender[1]
if (rank[recipient_tier] or 3) > (rank[tier] or 3) then
  tier = recipient_tier
end
local entry = {'from', ARGV[1], 'tier', tier, 'sent_at', ARGV[3]}
for i = 9, #ARGV do
  entry[#entry + 1] = ARGV[i]
end
entry[#entry + 1] = 'nonce'
entry[#entry + 1] = ARGV[4]
local id = redis.call('XADD', KEYS[3], 'NOMKSTREAM', '*', unpack(entry))
if not id then
  -- the recipient is registered but its stream was removed by hand: recreate it with its group
  redis.call('XGROUP', 'CREATE', KEYS[3], ARGV[6], '0', 'MKSTREAM')
  id = redis.call('XADD', KEYS[3], '*', unpack(entry))
end
return {id, tier}
