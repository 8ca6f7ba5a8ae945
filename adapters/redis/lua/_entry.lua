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
-- How often each of `entries` (read with one XRANGE, oldest first) was handed out: id -> deliveries,
-- from one XPENDING over their span ({} when none was, or the group is missing). An entry never
-- handed out has no row: read it as 0.
local function entry_deliveries(inbox, group, entries)
  local counts = {}
  if #entries == 0 then
    return counts
  end
  local detail = redis.pcall('XPENDING', inbox, group, entries[1][1], entries[#entries][1], #entries)
  if type(detail) == 'table' and not detail.err then
    for _, row in ipairs(detail) do
      counts[row[1]] = row[4]
    end
  end
  return counts
end
local function entry_expired(fields, now_ms)
  local at = entry_field(fields, 'expires_at')
  return at ~= nil and tonumber(at) <= now_ms
end
-- the envelope id of stream entry `id` with `nonce` (broker/ids.py: Crockford base32 of 50 bits of
-- milliseconds, 30 of sequence, then the nonce); Lua numbers are doubles, exact up to 2^53. Only where
-- a script itself writes or reads a dead letter's envelope_id: replies carry the stream id and nonce,
-- and Python encodes (tests/test_script_protocol.py checks the two encodings agree)
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
-- the stream entry id and the nonce of an envelope id (the inverse of envelope_id)
local function entry_of(envelope)
  local function value(text)
    local n = 0
    for i = 1, #text do
      n = n * 32 + string.find(crockford, string.sub(text, i, i), 1, true) - 1
    end
    return n
  end
  local ms, seq = value(string.sub(envelope, 5, 14)), value(string.sub(envelope, 15, 20))
  return string.format('%.0f-%.0f', ms, seq), string.sub(envelope, 21)
end
-- record how an envelope left its inbox, for its sender's status: in `outcomes` (the hash of the day)
-- nonce -> "<entry id> <attempts> <how>", how being 'acked', 'expired', 'dead <reason>',
-- 'purged' (purge.lua) or 'requeued <new entry id> <new nonce>'; kept until `until_ms` (ms since the epoch; '0' = keep none);
-- entry_outcomes writes several at once (`records`: nonce, value, ...)
local function entry_outcomes(outcomes, until_ms, records)
  if until_ms ~= '0' and #records > 0 then
    redis.call('HSET', outcomes, unpack(records))
    redis.call('PEXPIREAT', outcomes, until_ms)
  end
end
local function entry_outcome(outcomes, until_ms, nonce, value)
  entry_outcomes(outcomes, until_ms, {nonce, value})
end
-- keep entry {id, fields}, which just left its inbox, in the agent's history stream `history`: its
-- fields as they were, then entry_id (its inbox entry id), attempts, outcome ('acknowledged',
-- 'dead_lettered', 'expired') and reason (only when dead-lettered); the history entry's id is the
-- time it left (Redis TIME), noted in the positions hash `at` (inbox entry id -> history id, for
-- thread reads). History has no consumer group and no pending list, so trimming by time (MINID:
-- everything that left more than keep_ms ago) loses nothing unacknowledged; at most 64 old entries go
-- per call, their positions with them. keep_ms '0' keeps nothing (and writes nothing). With max_bytes
-- (not '0') the history's field bytes (names and values, summed in the positions hash's '=bytes'
-- field) are kept at most that: the oldest entries go, at most 64 per call, never the one just added.
-- `trimmed` true: this script already trimmed by time (ack.lua archives several entries in one call and
-- trims once, at the first). Returns the Redis time it read (ms), nil when it read none.
local function history_bytes(fields)
  local n = 0
  for j = 1, #fields do
    n = n + #tostring(fields[j])
  end
  return n
end
local function history_drop(history, at, old, upto)
  local gone, bytes = {}, 0
  for _, o in ipairs(old) do
    gone[#gone + 1] = entry_field(o[2], 'entry_id') or ''
    bytes = bytes + history_bytes(o[2])
  end
  redis.call('HDEL', at, unpack(gone))
  redis.call('HINCRBY', at, '=bytes', -bytes)
  redis.call('XTRIM', history, 'MINID', upto)
end
local function history_after(id)
  local dash = string.find(id, '-', 1, true)
  return string.sub(id, 1, dash) .. string.format('%.0f', tonumber(string.sub(id, dash + 1)) + 1)
end
local function entry_archive(history, at, keep_ms, max_bytes, e, attempts, outcome, reason, trimmed)
  if keep_ms == '0' then
    return nil
  end
  local kept = {unpack(e[2])}
  kept[#kept + 1] = 'entry_id'
  kept[#kept + 1] = e[1]
  kept[#kept + 1] = 'attempts'
  kept[#kept + 1] = attempts
  kept[#kept + 1] = 'outcome'
  kept[#kept + 1] = outcome
  if reason then
    kept[#kept + 1] = 'reason'
    kept[#kept + 1] = reason
  end
  local now_ms = nil
  if not trimmed then
    local t = redis.call('TIME')
    now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    local oldest = string.format('%.0f', math.max(0, now_ms - tonumber(keep_ms)))
    local old = redis.call('XRANGE', history, '-', '(' .. oldest, 'COUNT', 64)
    if #old > 0 then
      history_drop(history, at, old, #old < 64 and oldest or history_after(old[#old][1]))
    end
  end
  local hid = redis.call('XADD', history, '*', unpack(kept))
  redis.call('HSET', at, e[1], hid)
  local total = redis.call('HINCRBY', at, '=bytes', history_bytes(kept))
  local cap = tonumber(max_bytes)
  if cap > 0 and total > cap then
    local over, taken = total - cap, {}
    for _, o in ipairs(redis.call('XRANGE', history, '-', '(' .. hid, 'COUNT', 64)) do
      if over <= 0 then
        break
      end
      taken[#taken + 1] = o
      over = over - history_bytes(o[2])
    end
    if #taken > 0 then
      history_drop(history, at, taken, history_after(taken[#taken][1]))
    end
  end
  return now_ms
end
-- move entry {id, fields} of `inbox` to the dead-letter stream `dead` (envelope_id, the readable
-- fields but the nonce, attempts, reason, dead_at), XACK + XDEL it, record the outcome for the
-- sender's status (entry_outcome: 'expired' when that is the reason, else 'dead <reason>') and keep it
-- in the history (entry_archive)
local function entry_dead(inbox, dead, group, e, attempts, reason, dead_at, outcomes, until_ms, history, at, keep_ms, max_bytes)
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
  local how = 'expired'
  if reason ~= 'expired' then
    how = 'dead ' .. string.sub(reason, 1, 120)
    entry_archive(history, at, keep_ms, max_bytes, e, attempts, 'dead_lettered', reason)
  else
    entry_archive(history, at, keep_ms, max_bytes, e, attempts, 'expired', nil)
  end
  entry_outcome(outcomes, until_ms, nonce, e[1] .. ' ' .. attempts .. ' ' .. how)
end
