-- requeue.lua: move dead letters back into the inbox as new entries, oldest first.
-- Built by adapters/redis/protocol_delivery.py (requeue_call).
local dead = KEYS[1] -- dead-letter stream
local inbox = KEYS[2] -- inbox stream
local outcomes = KEYS[3] -- outcome hash of the day (the senders' status)
local at = KEYS[4] -- the history positions hash
local group = ARGV[1] -- consumer group
local wake_channel = ARGV[2]
local agent = ARGV[3] -- agent id
local until_ms = ARGV[4] -- when outcome records expire (ms since the epoch; 0 = no records)
local lineage = tonumber(ARGV[5]) -- earlier ids a requeued entry remembers at most
local n = tonumber(ARGV[6]) -- how many envelope ids follow (0 = take the oldest dead letters)
local first_id = 7 -- ARGV[7 .. 6+n] envelope ids to requeue; ARGV[7+n ..] fresh nonces, one per envelope
-- to requeue at most
-- Each dead letter becomes a new inbox entry (new stream id, new nonce, so a new envelope id) with its
-- from, tier, sent_at and body fields (not expires_at), plus requeued_from = its old envelope id and
-- the ids it had before that (newest first, space-separated, at most lineage); then it is XDELed from
-- the dead-letter stream, and its old nonce's outcome record says where it went ('requeued',
-- _entry.lua), so its sender's status follows it. The inbox cap is not checked: an operator asked for
-- this. When the history kept the old envelope, its position there now names the new entry
-- ('=<entry id> <nonce>'), so a thread read asking for the old id finds what it became. When anything
-- was requeued the agent id is published on the wake-up channel.
-- Returns a flat list: old envelope id, new stream id, nonce, ... for every entry requeued.
-- expires_at goes too: an operator who requeues an expired envelope wants it delivered
local dropped = {
  envelope_id = true, attempts = true, reason = true, dead_at = true, requeued_from = true, expires_at = true,
}
local wanted, nonces = nil, {}
if n > 0 then
  wanted = {}
  for i = first_id, first_id + n - 1 do
    wanted[ARGV[i]] = true
  end
end
for i = first_id + n, #ARGV do
  nonces[#nonces + 1] = ARGV[i]
end
if #nonces == 0 then
  return {}
end
if redis.call('EXISTS', inbox) == 0 then
  -- the inbox stream was removed by hand: recreate it with its group
  redis.call('XGROUP', 'CREATE', inbox, group, '0', 'MKSTREAM')
end
local out, taken = {}, 0
local cursor = '-'
while taken < #nonces do
  local page = redis.call('XRANGE', dead, cursor, '+', 'COUNT', 256)
  if #page == 0 then
    break
  end
  for _, e in ipairs(page) do
    local fields, old, earlier = e[2], nil, {}
    local entry = {}
    for j = 1, #fields - 1, 2 do
      if fields[j] == 'envelope_id' then
        old = fields[j + 1]
      elseif fields[j] == 'requeued_from' then
        for one in string.gmatch(fields[j + 1], '%S+') do
          earlier[#earlier + 1] = one
        end
      elseif not dropped[fields[j]] then
        entry[#entry + 1] = fields[j]
        entry[#entry + 1] = fields[j + 1]
      end
    end
    if old and (wanted == nil or wanted[old]) and taken < #nonces then
      taken = taken + 1
      local nonce = nonces[taken]
      local from = {old}
      for k = 1, math.min(#earlier, lineage - 1) do
        from[#from + 1] = earlier[k]
      end
      entry[#entry + 1] = 'requeued_from'
      entry[#entry + 1] = table.concat(from, ' ')
      entry[#entry + 1] = 'nonce'
      entry[#entry + 1] = nonce
      local new_id = redis.call('XADD', inbox, '*', unpack(entry))
      redis.call('XDEL', dead, e[1])
      local old_id, old_nonce = entry_of(old)
      local attempts = entry_field(fields, 'attempts') or '0'
      local went = old_id .. ' ' .. attempts .. ' requeued ' .. new_id .. ' ' .. nonce
      entry_outcome(outcomes, until_ms, old_nonce, went)
      if redis.call('HEXISTS', at, old_id) == 1 then
        redis.call('HSET', at, old_id, '=' .. new_id .. ' ' .. nonce)
      end
      out[#out + 1] = old
      out[#out + 1] = new_id
      out[#out + 1] = nonce
    end
  end
  cursor = '(' .. page[#page][1]
end
if #out > 0 then
  redis.call('PUBLISH', wake_channel, agent)
end
return out
