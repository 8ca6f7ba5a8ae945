-- send.lua: check both registrations and append one envelope to the recipient's inbox, atomically.
-- KEYS[1] sender registration hash   KEYS[2] recipient registration hash   KEYS[3] recipient inbox stream
-- ARGV[1] sender id   ARGV[2] sender session ("" = do not check)   ARGV[3] sent_at (ISO-8601 UTC)
-- ARGV[4] nonce   ARGV[5] inbox cap (0 = none)   ARGV[6] consumer group name
-- ARGV[7..] body fields as name, value pairs (the contract's readable fields)
-- Returns {stream entry id, tier label}. Errors (nothing written): RELAY_UNREGISTERED,
-- RELAY_SUPERSEDED, RELAY_UNKNOWN_RECIPIENT, RELAY_INBOX_FULL <cap>.
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
local tier = sender[1]
if (rank[recipient_tier] or 3) > (rank[tier] or 3) then
  tier = recipient_tier
end
local entry = {'from', ARGV[1], 'tier', tier, 'sent_at', ARGV[3]}
for i = 7, #ARGV do
  entry[#entry + 1] = ARGV[i]
end
entry[#entry + 1] = 'nonce'
entry[#entry + 1] = ARGV[4]
if redis.call('EXISTS', KEYS[3]) == 0 then
  -- the recipient is registered but its stream was removed by hand: recreate it with its group
  redis.call('XGROUP', 'CREATE', KEYS[3], ARGV[6], '0', 'MKSTREAM')
end
local id = redis.call('XADD', KEYS[3], '*', unpack(entry))
return {id, tier}
