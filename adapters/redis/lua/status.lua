-- status.lua: what became of envelopes in one recipient's inbox, for their sender's status.
-- Built by adapters/redis/protocol_inbox.py (status_call), which reads the reply (Outcome).
local inbox = KEYS[1] -- inbox stream; KEYS[2..] outcome hashes of the days a record may be in (one per day)
local group = ARGV[1] -- consumer group
local now = tonumber(ARGV[2]) -- ms since the epoch
local hops = tonumber(ARGV[3]) -- requeues followed at most
local first_envelope = 4
-- ARGV[4..] per envelope: stream entry id, nonce, the KEYS positions of its outcome days, newest first
-- ("<i> <j> ...")
-- Read-only. An entry still in the inbox is 'delivered' when pending (with its delivery count),
-- 'expired' when its expires_at has passed, else 'queued'. An entry gone from the inbox is what its
-- outcome record (_entry.lua) says, when the record is of that very entry id: 'acknowledged',
-- 'expired', 'purged' or 'dead_lettered' with its attempts (and reason); a requeued one is followed to the entry
-- it became. Without such a record (the nonce at another position, an entry deleted by hand) it is
-- 'unknown'.
-- Returns per envelope {state, deliveries (-1 = not known), reason or ''}.
local function live(fields, id)
  local row = redis.pcall('XPENDING', inbox, group, id, id, 1)
  local deliveries = 0
  if type(row) == 'table' and not row.err and row[1] then
    deliveries = row[1][4]
  end
  if entry_expired(fields, now) then
    return {'expired', deliveries, 'expired'}
  elseif deliveries > 0 then
    return {'delivered', deliveries, ''}
  end
  return {'queued', 0, ''}
end
local function record(nonce, days)
  for position in string.gmatch(days, '%d+') do
    local found = redis.call('HGET', KEYS[tonumber(position)], nonce)
    if found then
      return found
    end
  end
  return nil
end
local out = {}
for i = first_envelope, #ARGV, 3 do
  local id, nonce, days = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local result = {'unknown', -1, ''}
  for _ = 0, hops do
    local fields = entry_with_nonce(inbox, id, nonce)
    if fields then
      result = live(fields, id)
      break
    end
    local found = record(nonce, days)
    local at, attempts, how, rest = string.match(found or '', '^(%S+) (%d+) (%S+) ?(.*)$')
    if at ~= id then
      break
    end
    if how == 'requeued' then
      local next_id, next_nonce = string.match(rest, '^(%S+) (%S+)$')
      if not next_id then
        break
      end
      id, nonce = next_id, next_nonce
    else
      if how == 'acked' then
        result = {'acknowledged', tonumber(attempts), ''}
      elseif how == 'expired' then
        result = {'expired', tonumber(attempts), 'expired'}
      elseif how == 'purged' then
        result = {'purged', tonumber(attempts), ''}
      else
        result = {'dead_lettered', tonumber(attempts), rest}
      end
      break
    end
  end
  out[#out + 1] = result
end
return out
