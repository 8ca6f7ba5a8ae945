-- register.lua: upsert an agent's registration and make sure its inbox stream and group exist.
-- Built by adapters/redis/protocol_operator.py (register_call), which reads the reply (Registered).
local registration = KEYS[1] -- registration hash (one agent: one hash slot)
local inbox = KEYS[2] -- inbox stream
local retired = KEYS[3] -- the agent's retirement hash (retire.lua: at, sessions)
local agent = ARGV[1] -- agent id
local provider = ARGV[2]
local endpoint = ARGV[3]
local tier = ARGV[4] -- tier label
local session = ARGV[5]
local now = ARGV[6] -- ISO-8601 UTC, as registered_at and updated_at are stored
local group = ARGV[7] -- consumer group name
local wake_channel = ARGV[8]
local most = tonumber(ARGV[9]) -- how many superseded sessions to remember (field 'superseded', read by _session.lua)
-- Any webhook secret of the previous registration is dropped (see webhook_secret.lua), and so is
-- ended_at (leave.lua): a registration is a sign of life.
-- A new session wakes the agent's parked long-polls (they look again and find themselves superseded).
-- Also records seen_at (ms of Redis TIME): the agent's last registration, fetch or acknowledgement.
-- A retired agent (retire.lua) is registered again only from a session it did not have: one it had
-- is refused (RELAY_RETIRED, nothing written); another makes a fresh registration whose superseded
-- sessions are the retired ones, and the retirement is deleted.
-- Returns {previous session or "", registered_at, created (1|0)}.
local gone = redis.call('HGET', retired, 'sessions')
if gone then
  if string.find(' ' .. gone .. ' ', ' ' .. session .. ' ', 1, true) then
    return redis.error_reply('RELAY_RETIRED')
  end
  redis.call('DEL', retired)
end
local previous = redis.call('HMGET', registration, 'session', 'registered_at', 'superseded')
local created = 0
local registered_at = previous[2]
if not registered_at then
  registered_at = now
  created = 1
end
redis.call('HSET', registration,
  'agent', agent, 'provider', provider, 'endpoint', endpoint, 'tier', tier,
  'session', session, 'registered_at', registered_at, 'updated_at', now)
redis.call('HDEL', registration, 'webhook_secret', 'ended_at')
local clock = redis.call('TIME')
redis.call('HSET', registration, 'seen_at', clock[1] * 1000 + math.floor(clock[2] / 1000))
local ok = redis.pcall('XGROUP', 'CREATE', inbox, group, '0', 'MKSTREAM')
if type(ok) == 'table' and ok.err and not string.find(ok.err, 'BUSYGROUP', 1, true) then
  return redis.error_reply(ok.err)
end
if gone and not previous[1] then
  local kept = {}
  for s in string.gmatch(gone, '%S+') do
    if #kept < most then
      kept[#kept + 1] = s
    end
  end
  redis.call('HSET', registration, 'superseded', table.concat(kept, ' '))
end
if previous[1] and previous[1] ~= session then
  local kept = {previous[1]}
  for s in string.gmatch(previous[3] or '', '%S+') do
    if #kept >= most then
      break
    end
    if s ~= session and s ~= previous[1] then
      kept[#kept + 1] = s
    end
  end
  redis.call('HSET', registration, 'superseded', table.concat(kept, ' '))
  redis.call('PUBLISH', wake_channel, agent)
end
return {previous[1] or '', registered_at, created}
