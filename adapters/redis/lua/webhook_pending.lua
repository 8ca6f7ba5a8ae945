-- webhook_pending.lua: what an agent has not been told about yet (reads only).
-- KEYS[1] inbox stream   KEYS[2] webhook state hash
-- ARGV[1] envelopes to list at most
-- The state hash's 'cursor' is the stream entry id of the newest announced envelope.
-- Returns {unacknowledged count, newest entry id or "", rows {entry id, fields, 0, 0} after the cursor}.
local count = redis.call('XLEN', KEYS[1])
if count == 0 then
  return {0, '', {}}
end
local cursor = redis.call('HGET', KEYS[2], 'cursor') or '0-0'
local newest = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
local newest_id = newest[1][1]
local rows = {}
for _, entry in ipairs(redis.call('XRANGE', KEYS[1], '(' .. cursor, '+', 'COUNT', tonumber(ARGV[1]))) do
  rows[#rows + 1] = {entry[1], entry[2], 0, 0}
end
if #rows == 0 then
  newest_id = ''
end
return {count, newest_id, rows}
