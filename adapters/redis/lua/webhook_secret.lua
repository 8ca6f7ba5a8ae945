-- webhook_secret.lua: keep a webhook secret with the registration it was issued for.
-- KEYS[1] registration hash
-- ARGV[1] session   ARGV[2] endpoint   ARGV[3] secret
-- Stored only while the registration is still that session's at that endpoint (a registration made
-- in between keeps no secret of another's). Returns 1 when stored, 0 when not.
local current = redis.call('HMGET', KEYS[1], 'session', 'endpoint')
if current[1] ~= ARGV[1] or current[2] ~= ARGV[2] then
  return 0
end
redis.call('HSET', KEYS[1], 'webhook_secret', ARGV[3])
return 1
