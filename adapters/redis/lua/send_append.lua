-- send_append.lua: step 2 of a send, on the recipient's slot: check the recipient and append.
-- KEYS[1] recipient registration hash   KEYS[2] recipient inbox stream
-- KEYS[3] the idempotency record (string), only when ARGV[10] is not ''
-- ARGV[1] sender id   ARGV[2] sender tier (from send_check.lua)   ARGV[3] sent_at (ISO-8601 UTC)
-- ARGV[4] nonce   ARGV[5] inbox cap (0 = none)   ARGV[6] consumer group name
-- ARGV[7] wake-up channel   ARGV[8] recipient id   ARGV[9] expires_at in ms ('' = never)
-- ARGV[10] request hash ('' = no idempotency key)   ARGV[11] dedup window in ms   ARGV[12] sent_at in ms
-- ARGV[13..#ARGV-1] body fields as name, value pairs
-- KEYS[#KEYS] the recipient's contact policy hash (keys.py: policy; last, after the optional KEYS[3])
-- ARGV[#ARGV] the sender's provider (from send_check.lua; '' = no registration)
-- With an idempotency key, a record of the same request answers with the original result and nothing
-- is written (a first attempt that landed after its client gave up included); a record of another
-- request is a conflict. Otherwise the recipient's registration, contact policy and cap are checked
-- atomically with the XADD (and the record is written); then the recipient id is published on the
-- wake-up channel (parked long-polls of that agent look again). The policy comes after the
-- registration and before the cap, so a sender it does not accept learns nothing of the inbox.
-- Returns {stream entry id, tier label (the wider of sender's and recipient's), nonce, sent_at ms,
-- repeat (1|0)}. Errors (nothing written): RELAY_UNKNOWN_RECIPIENT, RELAY_NOT_ACCEPTED <tier> <kind>,
-- RELAY_INBOX_FULL <cap> <depth>, RELAY_IDEMPOTENCY_CONFLICT.
if ARGV[10] ~= '' then
  local record = redis.call('GET', KEYS[3])
  if record then
    local hash, id, nonce, sent_ms, tier = string.match(record, '^(%S+) (%S+) (%S+) (%S+) (%S+)$')
    if hash ~= ARGV[10] then
      return redis.error_reply('RELAY_IDEMPOTENCY_CONFLICT')
    end
    return {id, tier, nonce, sent_ms, 1}
  end
end
local rank = {in_process = 1, host = 2, network = 3}
local recipient_tier = redis.call('HGET', KEYS[1], 'tier')
if not recipient_tier then
  return redis.error_reply('RELAY_UNKNOWN_RECIPIENT')
end
local tier = ARGV[2]
if (rank[recipient_tier] or 3) > (rank[tier] or 3) then
  tier = recipient_tier
end
-- contact policy (broker/policy.py: ContactPolicy.accepts; docs/policy.md) ---------------------------
local accept_from = redis.call('HGET', KEYS[#KEYS], '=accept_from')
if accept_from then
  local accepted = false
  if accept_from == 'list' then
    accepted = redis.call('HEXISTS', KEYS[#KEYS], ARGV[1]) == 1
  elseif accept_from == 'registered' then
    accepted = ARGV[#ARGV] ~= ''
  end
  if not accepted then
    return redis.error_reply('RELAY_NOT_ACCEPTED ' .. tier .. ' ' .. accept_from)
  end
end
-- end of the contact policy -------------------------------------------------------------------------
local cap = tonumber(ARGV[5])
if cap > 0 then
  local depth = redis.call('XLEN', KEYS[2])
  if depth >= cap then
    return redis.error_reply('RELAY_INBOX_FULL ' .. ARGV[5] .. ' ' .. depth)
  end
end
local body = {}
for i = 13, #ARGV - 1 do
  body[#body + 1] = ARGV[i]
end
local entry = entry_new(ARGV[1], tier, ARGV[3], ARGV[9], body, ARGV[4])
local id = redis.call('XADD', KEYS[2], 'NOMKSTREAM', '*', unpack(entry))
if not id then
  -- the recipient is registered but its stream was removed by hand: recreate it with its group
  redis.call('XGROUP', 'CREATE', KEYS[2], ARGV[6], '0', 'MKSTREAM')
  id = redis.call('XADD', KEYS[2], '*', unpack(entry))
end
if ARGV[10] ~= '' then
  local record = table.concat({ARGV[10], id, ARGV[4], ARGV[12], tier}, ' ')
  redis.call('SET', KEYS[3], record, 'PX', ARGV[11])
end
redis.call('PUBLISH', ARGV[7], ARGV[8])
return {id, tier, ARGV[4], ARGV[12], 0}
