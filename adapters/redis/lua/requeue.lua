-- requeue.lua: move dead letters back into the inbox as new entries, oldest first.
-- KEYS[1] dead-letter stream   KEYS[2] inbox stream
-- ARGV[1] consumer group   ARGV[2] wake-up channel   ARGV[3] agent id
-- ARGV[4] n = how many envelope ids follow (0 = take the oldest dead letters)
-- ARGV[5 .. 4+n] envelope ids to requeue   ARGV[5+n ..] fresh nonces, one per envelope to requeue at most
-- Each dead letter becomes a new inbox entry (new stream id, new nonce, so a new envelope id) with its
-- from, tier, sent_at and body fields (not expires_at), plus requeued_from = its old envelope id; then it is XDELed from
-- the dead-letter stream. The inbox cap is not checked: an operator asked for this. When anything
-- was requeued the agent id is published on the wake-up channel.
-- Returns a flat list: old envelope id, new stream id, nonce, ... for every entry requeued.
-- expires_at goes too: an operator who requeues an expired envelope wants it delivered
local dropped = {
  envelope_id = true, attempts = true, reason = true, dead_at = true, requeued_from = true, expires_at = true,
}
local group, n = ARGV[1], tonumber(ARGV[4])
local wanted, nonces = nil, {}
if n > 0 then
  wanted = {}
  for i = 5, 4 + n do
    wanted[ARGV[i]] = true
  end
end
for i = 5 + n, #ARGV do
  nonces[#nonces + 1] = ARGV[i]
end
if #nonces == 0 then
  return {}
end
if redis.call('EXISTS', KEYS[2]) == 0 then
  -- the inbox stream was removed by hand: recreate it with its group
  redis.call('XGROUP', 'CREATE', KEYS[2], group, '0', 'MKSTREAM')
end
local out, taken = {}, 0
local cursor = '-'
while taken < #nonces do
  local page = redis.call('XRANGE', KEYS[1], cursor, '+', 'COUNT', 256)
  if #page == 0 then
    break
  end
  for _, e in ipairs(page) do
    local fields, old = e[2], nil
    local entry = {}
    for j = 1, #fields - 1, 2 do
      if fields[j] == 'envelope_id' then
        old = fields[j + 1]
      elseif not dropped[fields[j]] then
        entry[#entry + 1] = fields[j]
        entry[#entry + 1] = fields[j + 1]
      end
    end
    if old and (wanted == nil or wanted[old]) and taken < #nonces then
      taken = taken + 1
      local nonce = nonces[taken]
      entry[#entry + 1] = 'requeued_from'
      entry[#entry + 1] = old
      entry[#entry + 1] = 'nonce'
      entry[#entry + 1] = nonce
      local new_id = redis.call('XADD', KEYS[2], '*', unpack(entry))
      redis.call('XDEL', KEYS[1], e[1])
      out[#out + 1] = old
      out[#out + 1] = new_id
      out[#out + 1] = nonce
    end
  end
  cursor = '(' .. page[#page][1]
end
if #out > 0 then
  redis.call('PUBLISH', ARGV[2], ARGV[3])
end
return out
