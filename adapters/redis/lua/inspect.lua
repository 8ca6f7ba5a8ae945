-- inspect.lua: one agent's figures, read-only; no message text is returned.
-- Built by adapters/redis/protocol_operator.py (inspect_call).
local registration_key = KEYS[1] -- registration hash
local inbox = KEYS[2] -- inbox stream
local dead = KEYS[3] -- dead-letter stream
local counts_key = KEYS[4] -- counts hash
local group = ARGV[1] -- consumer group
-- Returns {registration as field, value, ...; XLEN inbox; pending count; oldest unacknowledged entry id
-- or ''; XLEN dead letters; {expired, max_deliveries} counts of envelopes fetch or a sweep moved}.
local registration = redis.call('HGETALL', registration_key)
local depth = redis.call('XLEN', inbox)
local pending, oldest = 0, ''
local summary = redis.pcall('XPENDING', inbox, group)
if type(summary) == 'table' and not summary.err and summary[1] > 0 then
  pending = summary[1]
  oldest = summary[2]
end
if oldest == '' and depth > 0 then
  local first = redis.call('XRANGE', inbox, '-', '+', 'COUNT', 1)[1]
  if first then
    oldest = first[1]
  end
end
local counts = redis.call('HMGET', counts_key, 'expired', 'max_deliveries')
return {registration, depth, pending, oldest, redis.call('XLEN', dead), {counts[1] or 0, counts[2] or 0}}
