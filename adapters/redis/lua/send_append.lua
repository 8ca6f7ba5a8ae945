-- send_append.lua: step 2 of a send, on the recipient's slot: check the recipient and append.
-- Built by adapters/redis/protocol.py (send_call, with_tier), which reads the reply (SendAppended).
local registration = KEYS[1] -- recipient registration hash
local inbox = KEYS[2] -- recipient inbox stream
local record_key = KEYS[3] -- the idempotency record (string), only when request_hash is not ''
local sender = ARGV[1] -- sender id
local sender_tier = ARGV[2] -- from send_check.lua
local sent_at = ARGV[3] -- ISO-8601 UTC, as the entry stores it
local nonce = ARGV[4]
local cap = tonumber(ARGV[5]) -- inbox cap (0 = none)
local group = ARGV[6] -- consumer group name
local wake_channel = ARGV[7]
local recipient = ARGV[8] -- recipient id
local expires_at = ARGV[9] -- ms since the epoch ('' = never)
local request_hash = ARGV[10] -- '' = no idempotency key
local window_ms = ARGV[11] -- dedup window in ms
local sent_ms = ARGV[12] -- sent_at in ms
local parent = ARGV[13] -- the envelope id it replies to ('' = none)
local replies_until = ARGV[14] -- when the replies index hash expires (ms since the epoch; 0 = no index)
local policy = KEYS[#KEYS] -- the recipient's contact policy hash (keys.py: policy; always last)
local replies = KEYS[#KEYS - 1] -- the replies index of the parent's day, only when parent is not ''
local sender_provider = ARGV[#ARGV] -- from send_check.lua ('' = no registration)
local body = {unpack(ARGV, 15, #ARGV - 1)} -- body fields as name, value pairs, before the provider
-- With an idempotency key, a record of the same request answers with the original result and nothing
-- is written (a first attempt that landed after its client gave up included); a record of another
-- request is a conflict. Otherwise the recipient's registration, contact policy and cap are checked
-- atomically with the XADD (and the record is written); then the recipient id is published on the
-- wake-up channel (parked long-polls of that agent look again). The policy comes after the
-- registration and before the cap, so a sender it does not accept learns nothing of the inbox. A
-- reply's id is added to the recipient's replies index under the envelope it answers (at most
-- MAX_REPLIES ids each), so a thread read finds it without reading any inbox.
-- Returns {stream entry id, tier label (the wider of sender's and recipient's), nonce, sent_at ms,
-- repeat (1|0)}. Errors (nothing written): RELAY_UNKNOWN_RECIPIENT, RELAY_NOT_ACCEPTED <tier> <kind>,
-- RELAY_INBOX_FULL <cap> <depth>, RELAY_IDEMPOTENCY_CONFLICT.
if request_hash ~= '' then
  local record = redis.call('GET', record_key)
  if record then
    local hash, id, first_nonce, first_ms, tier = string.match(record, '^(%S+) (%S+) (%S+) (%S+) (%S+)$')
    if hash ~= request_hash then
      return redis.error_reply('RELAY_IDEMPOTENCY_CONFLICT')
    end
    return {id, tier, first_nonce, first_ms, 1}
  end
end
-- broker/envelope.py's Tier order (tests/test_script_protocol.py checks the two agree)
local rank = {in_process = 1, host = 2, network = 3}
local recipient_tier = redis.call('HGET', registration, 'tier')
if not recipient_tier then
  return redis.error_reply('RELAY_UNKNOWN_RECIPIENT')
end
local tier = sender_tier
if (rank[recipient_tier] or 3) > (rank[tier] or 3) then
  tier = recipient_tier
end
-- contact policy (broker/policy.py: ContactPolicy.accepts; docs/policy.md) ---------------------------
local accept_from = redis.call('HGET', policy, '=accept_from')
if accept_from then
  local accepted = false
  if accept_from == 'list' then
    accepted = redis.call('HEXISTS', policy, sender) == 1
  elseif accept_from == 'registered' then
    accepted = sender_provider ~= ''
  end
  if not accepted then
    return redis.error_reply('RELAY_NOT_ACCEPTED ' .. tier .. ' ' .. accept_from)
  end
end
-- end of the contact policy -------------------------------------------------------------------------
if cap > 0 then
  local depth = redis.call('XLEN', inbox)
  if depth >= cap then
    return redis.error_reply('RELAY_INBOX_FULL ' .. string.format('%d', cap) .. ' ' .. depth)
  end
end
local entry = entry_new(sender, tier, sent_at, expires_at, body, nonce)
local id = redis.call('XADD', inbox, 'NOMKSTREAM', '*', unpack(entry))
if not id then
  -- the recipient is registered but its stream was removed by hand: recreate it with its group
  redis.call('XGROUP', 'CREATE', inbox, group, '0', 'MKSTREAM')
  id = redis.call('XADD', inbox, '*', unpack(entry))
end
if request_hash ~= '' then
  local record = table.concat({request_hash, id, nonce, sent_ms, tier}, ' ')
  redis.call('SET', record_key, record, 'PX', window_ms)
end
if parent ~= '' and replies_until ~= '0' then
  local known = redis.call('HGET', replies, parent)
  local child = envelope_id(id, nonce)
  if not known then
    redis.call('HSET', replies, parent, child)
  elseif #known < 31 * 1000 then -- MAX_REPLIES: 1000 ids of 30 characters and a space
    redis.call('HSET', replies, parent, known .. ' ' .. child)
  end
  redis.call('PEXPIREAT', replies, replies_until)
end
redis.call('PUBLISH', wake_channel, recipient)
return {id, tier, nonce, sent_ms, 0}
