-- status.lua: what became of envelopes in one recipient's inbox, for their sender's status.
-- KEYS[1] inbox stream   KEYS[2] outcome hash (nonce -> "<attempts> <reason>")
-- ARGV[1] consumer group   ARGV[2] now (ms since the epoch)   ARGV[3..] stream entry id, nonce pairs
-- Read-only. An entry still in the inbox is 'delivered' when pending (with its delivery count),
-- 'expired' when its expires_at has passed, else 'queued'. An entry gone from the inbox is what its
-- outcome record says ('expired', or 'dead_lettered' with the reason), and 'acknowledged' without one:
-- only acknowledging removes an entry without a record.
-- Returns per pair {state, deliveries (-1 = not known), reason or ''}.
local group, now = ARGV[1], tonumber(ARGV[2])
local out = {}
for i = 3, #ARGV, 2 do
  local id, nonce = ARGV[i], ARGV[i + 1]
  local fields = entry_with_nonce(KEYS[1], id, nonce)
  local result
  if fields then
    local row = redis.pcall('XPENDING', KEYS[1], group, id, id, 1)
    local deliveries = 0
    if type(row) == 'table' and not row.err and row[1] then
      deliveries = row[1][4]
    end
    if entry_expired(fields, now) then
      result = {'expired', deliveries, 'expired'}
    elseif deliveries > 0 then
      result = {'delivered', deliveries, ''}
    else
      result = {'queued', 0, ''}
    end
  else
    local record = redis.call('HGET', KEYS[2], nonce)
    if record then
      local attempts, reason = string.match(record, '^(%d+) (.*)$')
      local state = 'dead_lettered'
      if reason == 'expired' then
        state = 'expired'
      end
      result = {state, tonumber(attempts) or -1, reason or ''}
    else
      result = {'acknowledged', -1, ''}
    end
  end
  out[#out + 1] = result
end
return out
