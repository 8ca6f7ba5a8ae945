-- webhook_secret.lua: keep a webhook secret with the registration it was issued for.
-- Built by adapters/redis/protocol_operator.py (webhook_secret_call).
local registration = KEYS[1] -- registration hash
local session = ARGV[1]
local endpoint = ARGV[2]
local secret = ARGV[3]
-- Stored only while the registration is still that session's at that endpoint (a registration made
-- in between keeps no secret of another's). Returns 1 when stored, 0 when not.
local current = redis.call('HMGET', registration, 'session', 'endpoint')
if current[1] ~= session or current[2] ~= endpoint then
  return 0
end
redis.call('HSET', registration, 'webhook_secret', secret)
return 1
