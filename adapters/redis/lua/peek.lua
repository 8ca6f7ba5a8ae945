-- peek.lua: unacknowledged entries of one inbox, oldest first, read-only (nothing handed out or counted).
-- Built by adapters/redis/protocol_operator.py (peek_call).
local inbox = KEYS[1] -- inbox stream
local group = ARGV[1] -- consumer group
local first = ARGV[2] -- first entry id (inclusive, or '(' id for exclusive, or '-')
local count = tonumber(ARGV[3])
-- Returns a flat list: for each entry {id, {field, value, ...}, deliveries so far (0 = never fetched), 0}.
local entries = redis.call('XRANGE', inbox, first, '+', 'COUNT', count)
local counts = entry_deliveries(inbox, group, entries)
local out = {}
for _, e in ipairs(entries) do
  out[#out + 1] = {e[1], e[2], counts[e[1]] or 0, 0}
end
return out
