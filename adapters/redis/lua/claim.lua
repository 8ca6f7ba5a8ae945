-- claim.lua: hand envelopes of an inbox to one receive-loop consumer: idle ones first, then new ones.
-- Built by adapters/redis/protocol_delivery.py (claim_call).
local registration = KEYS[1] -- registration hash
local inbox = KEYS[2] -- inbox stream
local group = ARGV[1] -- consumer group
local consumer = ARGV[2] -- consumer name (<agent>@<loop-id>)
local count = tonumber(ARGV[3])
local idle = tonumber(ARGV[4]) -- visibility timeout in ms (min idle time of an entry another consumer may be holding)
-- Idle entries are taken over with XAUTOCLAIM (which adds one to their delivery count); its cursor is
-- followed because one call scans at most COUNT x 10 pending entries. New entries come from
-- XREADGROUP '>' (delivery count 1). Entries this consumer holds and touches are not idle, so they are
-- not returned again.
-- Returns a flat list: for each entry {id, {field, value, ...}, deliveries, first (1|0)}.
-- Errors: RELAY_UNREGISTERED.
if redis.call('EXISTS', registration) == 0 then
  return redis.error_reply('RELAY_UNREGISTERED')
end
local out = {}
local reply = redis.pcall('XAUTOCLAIM', inbox, group, consumer, idle, '0-0', 'COUNT', count)
if type(reply) == 'table' and reply.err then
  if not string.find(reply.err, 'NOGROUP', 1, true) then
    return redis.error_reply(reply.err)
  end
  -- the stream or its group was removed by hand: recreate it, nothing can be pending
  redis.call('XGROUP', 'CREATE', inbox, group, '0', 'MKSTREAM')
  reply = {'0-0', {}}
end
-- bounded: 64 x COUNT x 10 pending entries is far more than an inbox of in-process deliveries holds
for _ = 1, 64 do
  for _, e in ipairs(reply[2]) do
    -- Redis >= 7 leaves deleted entries out of the claimed list; older servers give them nil fields
    if e[2] then
      local row = redis.call('XPENDING', inbox, group, e[1], e[1], 1)[1]
      out[#out + 1] = {e[1], e[2], row and row[4] or 2, 0}
    end
  end
  if reply[1] == '0-0' or #out >= count then
    break
  end
  reply = redis.call('XAUTOCLAIM', inbox, group, consumer, idle, reply[1], 'COUNT', count - #out)
end
if #out < count then
  local fresh = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', count - #out, 'STREAMS', inbox, '>')
  if fresh and fresh[1] then
    for _, e in ipairs(fresh[1][2]) do
      out[#out + 1] = {e[1], e[2], 1, 1}
    end
  end
end
return out
