-- _entry.lua: the stream entry layout, prepended to every script that reads or writes inbox entries
-- (adapters/redis/scripts.py). adapters/redis/entries.py is its Python twin.
-- An entry is one envelope: from, tier, sent_at, the contract's body fields, then nonce (the last
-- 10 characters of the envelope id; the rest of the id is the entry id).
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
local function entry_new(sender, tier, sent_at, body, nonce)
  local entry = {'from', sender, 'tier', tier, 'sent_at', sent_at}
  for i = 1, #body do
    entry[#entry + 1] = body[i]
  end
  entry[#entry + 1] = 'nonce'
  entry[#entry + 1] = nonce
  return entry
end
