-- locate.lua: where one envelope is in one agent's streams; read-only, no message text is returned.
-- Built by adapters/redis/protocol_operator.py (locate_call), which reads the reply (Place).
local inbox = KEYS[1] -- inbox stream (one agent: one hash slot)
local dead = KEYS[2] -- dead-letter stream
local group = ARGV[1] -- consumer group
local id = ARGV[2] -- stream entry id
local nonce = ARGV[3]
local envelope = ARGV[4] -- envelope id
local most = tonumber(ARGV[5]) -- dead letters to look through at most
-- Returns {} when the envelope is in neither stream;
-- {'inbox', from, tier, sent_at, deliveries (0: never handed out), consumer or '', idle ms or -1};
-- {'dead', from, tier, sent_at, attempts, reason, dead_at, dead-letter entry id}.
local found = redis.call('XRANGE', inbox, id, id)[1]
if found and entry_field(found[2], 'nonce') == nonce then
  local f = found[2]
  local deliveries, consumer, idle = 0, '', -1
  local pending = redis.pcall('XPENDING', inbox, group, id, id, 1)
  if type(pending) == 'table' and not pending.err and pending[1] then
    consumer, idle, deliveries = pending[1][2], pending[1][3], pending[1][4]
  end
  return {'inbox', entry_field(f, 'from') or '', entry_field(f, 'tier') or '', entry_field(f, 'sent_at') or '',
    deliveries, consumer, idle}
end
-- a dead letter is added after its envelope was sent: look from the envelope's milliseconds on
local start = string.match(id, '^(%d+)') .. '-0'
local left = most
while left > 0 do
  local batch = redis.call('XRANGE', dead, start, '+', 'COUNT', math.min(left, 500))
  if #batch == 0 then
    break
  end
  for _, e in ipairs(batch) do
    local f = e[2]
    if entry_field(f, 'envelope_id') == envelope then
      return {'dead', entry_field(f, 'from') or '', entry_field(f, 'tier') or '', entry_field(f, 'sent_at') or '',
        entry_field(f, 'attempts') or '0', entry_field(f, 'reason') or '', entry_field(f, 'dead_at') or '', e[1]}
    end
  end
  left = left - #batch
  start = '(' .. batch[#batch][1]
end
return {}
