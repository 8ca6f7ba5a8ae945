-- leave.lua: a session says it ended (POST /agent/leave), on the agent's slot.
-- Built by adapters/redis/protocol_operator.py (leave_call).
local registration = KEYS[1] -- registration hash
local session = ARGV[1] -- the session that ended
-- Only the registered session may say so: ended_at (ms of Redis TIME) is written in the registration
-- hash (broker/presence.py: gone until seen_at moves past it); register.lua drops it.
-- Returns 1 when noted, 0 when `session` is not the registered one (nothing written).
if redis.call('HGET', registration, 'session') ~= session then
  return 0
end
local now = redis.call('TIME')
redis.call('HSET', registration, 'ended_at', now[1] * 1000 + math.floor(now[2] / 1000))
return 1
