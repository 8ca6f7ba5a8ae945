-- inspect.lua: one agent's figures, read-only; no message text is returned.
-- KEYS[1] registration hash   KEYS[2] inbox stream   KEYS[3] dead-letter stream   KEYS[4] counts hash
-- ARGV[1] consumer group
-- Returns {registration as field, value, ...; XLEN inbox; pending count; oldest unacknowledged entry id
-- or ''; XLEN dead letters; {expired, max_deliveries} counts of envelopes fetch or a sweep moved}.
local registration = redis.call('HGETALL', KEYS[1])
local depth = redis.call('XLEN', KEYS[2])
local pending, oldest = 0, ''
local summary = redis.pcall('XPENDING', KEYS[2], ARGV[1])
if type(summary) == 'table' and not summary.err and summary[1] > 0 then
  pending = summary[1]
  oldest = summary[2]
end
if oldest == '' and depth > 0 then
  local first = redis.call('XRANGE', KEYS[2], '-', '+', 'COUNT', 1)[1]
  if first then
    oldest = first[1]
  end
end
local counts = redis.call('HMGET', KEYS[4], 'expired', 'max_deliveries')
return {registration, depth, pending, oldest, redis.call('XLEN', KEYS[3]), {counts[1] or 0, counts[2] or 0}}
