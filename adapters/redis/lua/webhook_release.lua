-- webhook_release.lua: give up an agent's notifier claim, if it is still ours.
-- Built by adapters/redis/protocol_operator.py (webhook_release_call).
local claim_key = KEYS[1] -- claim string
local registration = KEYS[2] -- the agent's registration hash
local holder = ARGV[1]
local answered = ARGV[2] -- the session whose endpoint took a notification ('' = none did)
-- An endpoint that took a notification is a sign of life of that session: seen_at (ms of Redis TIME)
-- moves when the session is still the registered one.
-- Returns 1 when released, 0 when the claim had lapsed or belongs to another holder.
if answered ~= '' and redis.call('HGET', registration, 'session') == answered then
  local now = redis.call('TIME')
  redis.pcall('HSET', registration, 'seen_at', now[1] * 1000 + math.floor(now[2] / 1000))
end
if redis.call('GET', claim_key) == holder then
  return redis.call('DEL', claim_key)
end
return 0
