-- inspect.lua: one agent's figures, read-only; no message text is returned.
-- KEYS[1] registration hash   KEYS[2] inbox stream   KEYS[3] dead-letter stream
-- ARGV[1] consumer group
-- Returns {registration as field, value, ...; XLEN inbox; pending count; oldest unacknowledged entry id
-- or ''; XLEN dead letters}.
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
return {registration, depth, pending, oldest, redis.call('XLEN', KEYS[3])}
