-- send_append.lua: step 2 of a send, on the recipient's slot: check the recipient and append.
-- KEYS[1] recipient registration hash   KEYS[2] recipient inbox stream
-- ARGV[1] sender id   ARGV[2] sender tier (from send_check.lua)   ARGV[3] sent_at (ISO-8601 UTC)
-- ARGV[4] nonce   ARGV[5] inbox cap (0 = none)   ARGV[6] consumer group name
-- ARGV[7] wake-up channel   ARGV[8] recipient id   ARGV[9..] body fields as name, value pairs
-- The recipient's registration and the cap are checked atomically with the XADD; then the recipient
-- id is published on the wake-up channel (parked long-polls of that agent look again).
-- Returns {stream entry id, tier label (the wider of sender's and recipient's)}.
-- Errors (nothing written): RELAY_UNKNOWN_RECIPIENT, RELAY_INBOX_FULL <cap> <depth>.
local rank = {in_process = 1, host = 2, network = 3}
local recipient_tier = redis.call('HGET', KEYS[1], 'tier')
if not recipient_tier then
  return redis.error_reply('RELAY_UNKNOWN_RECIPIENT')
end
local cap = tonumber(ARGV[5])
if cap > 0 then
  local depth = redis.call('XLEN', KEYS[2])
  if depth >= cap then
    return redis.error_reply('RELAY_INBOX_FULL ' .. ARGV[5] .. ' ' .. depth)
  end
end
local tier = ARGV[2]
if (rank[recipient_tier] or 3) > (rank[tier] or 3) then
  tier = recipient_tier
end
local body = {}
for i = 9, #ARGV do
  body[#body + 1] = ARGV[i]
end
local entry = entry_new(ARGV[1], tier, ARGV[3], body, ARGV[4])
local id = redis.call('XADD', KEYS[2], 'NOMKSTREAM', '*', unpack(entry))
if not id then
  -- the recipient is registered but its stream was removed by hand: recreate it with its group
  redis.call('XGROUP', 'CREATE', KEYS[2], ARGV[6], '0', 'MKSTREAM')
  id = redis.call('XADD', KEYS[2], '*', unpack(entry))
end
redis.call('PUBLISH', ARGV[7], ARGV[8])
return {id, tier}
