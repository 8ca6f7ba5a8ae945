-- _entry.lua: the stream entry layout, prepended to every script that reads or writes inbox entries
-- (adapters/redis/scripts.py). adapters/redis/entries.py is its Python twin.
-- An entry is one envelope: from, tier, sent_at, expires_at (ms since the epoch; only with a ttl), the
-- contract's body fields, then nonce (the last 10 characters of the envelope id; the rest of the id is
-- the entry id).
local function entry_field(fields, name)
  for j = 1, #fields - 1, 2 do
    if fields[j] == name then
      return fields[j + 1]
    end
  end
  return nil
end
-- the fields of entry `id` of `stream` when it exists and carries `nonce`, else nil
local function entry_with_nonce(stream, id, nonce)
  local found = redis.call('XRANGE', stream, id, id)[1]
  if found and entry_field(found[2], 'nonce') == nonce then
    return found[2]
  end
  return nil
end
-- a new entry's field list: header, body name/value pairs (a flat list), nonce
local function entry_new(sender, tier, sent_at, expires_at, body, nonce)
  local entry = {'from', sender, 'tier', tier, 'sent_at', sent_at}
  if expires_at ~= '' then
    entry[#entry + 1] = 'expires_at'
    entry[#entry + 1] = expires_at
  end
  for i = 1, #body do
    entry[#entry + 1] = body[i]
  end
  entry[#entry + 1] = 'nonce'
  entry[#entry + 1] = nonce
  return entry
end
-- true when the entry carries an expires_at at or before now_ms
local function entry_expired(fields, now_ms)
  local at = entry_field(fields, 'expires_at')
  return at ~= nil and tonumber(at) <= now_ms
end
-- the envelope id of stream entry `id` with `nonce` (broker/ids.py: Crockford base32 of 50 bits of
-- milliseconds, 30 of sequence, then the nonce); Lua numbers are doubles, exact up to 2^53
local crockford = '0123456789ABCDEFGHJKMNPQRSTVWXYZ'
local function base32(value, chars)
  local out = {}
  for i = chars, 1, -1 do
    local digit = value % 32
    out[i] = string.sub(crockford, digit + 1, digit + 1)
    value = (value - digit) / 32
  end
  return table.concat(out)
end
local function envelope_id(id, nonce)
  local dash = string.find(id, '-', 1, true)
  return 'env_' .. base32(tonumber(string.sub(id, 1, dash - 1)), 10)
    .. base32(tonumber(string.sub(id, dash + 1)), 6) .. nonce
end
-- move entry {id, fields} of `inbox` to the dead-letter stream `dead` (envelope_id, the readable
-- fields but the nonce, attempts, reason, dead_at), XACK + XDEL it, and record the outcome for the
-- sender's status (`outcomes` hash: nonce -> "<attempts> <reason>", kept `retention_ms`; '' = none)
local function entry_dead(inbox, dead, group, e, attempts, reason, dead_at, outcomes, retention_ms)
  local fields, nonce = e[2], ''
  local letter = {'envelope_id', ''}
  for j = 1, #fields - 1, 2 do
    if fields[j] == 'nonce' then
      nonce = fields[j + 1]
    else
      letter[#letter + 1] = fields[j]
      letter[#letter + 1] = fields[j + 1]
    end
  end
  letter[2] = envelope_id(e[1], nonce)
  letter[#letter + 1] = 'attempts'
  letter[#letter + 1] = attempts
  letter[#letter + 1] = 'reason'
  letter[#letter + 1] = reason
  letter[#letter + 1] = 'dead_at'
  letter[#letter + 1] = dead_at
  redis.call('XADD', dead, '*', unpack(letter))
  redis.call('XACK', inbox, group, e[1])
  redis.call('XDEL', inbox, e[1])
  if outcomes ~= '' and tonumber(retention_ms) > 0 then
    redis.call('HSET', outcomes, nonce, attempts .. ' ' .. string.sub(reason, 1, 120))
    redis.call('PEXPIRE', outcomes, retention_ms)
  end
end
