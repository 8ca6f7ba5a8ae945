-- register.lua: upsert an agent's registration and make sure its inbox stream and group exist.
-- KEYS[1] registration hash   KEYS[2] inbox stream   (one agent: one hash slot)
-- ARGV[1] agent id   ARGV[2] provider   ARGV[3] endpoint   ARGV[4] tier label   ARGV[5] session
-- ARGV[6] now (ISO-8601 UTC)   ARGV[7] consumer group name   ARGV[8] wake-up channel
-- ARGV[9] how many superseded sessions to remember (field 'superseded', read by _session.lua)
-- Any webhook secret of the previous registration is dropped (see webhook_secret.lua).
-- A new session wakes the agent's parked long-polls (they look again and find themselves superseded).
-- Also records seen_at (ms of Redis TIME): the agent's last registration, fetch or acknowledgement.
-- Returns {previous session or "", registered_at, created (1|0)}.
local previous = redis.call('HMGET', KEYS[1], 'session', 'registered_at', 'superseded')
local created = 0
local registered_at = previous[2]
if not registered_at then
  registered_at = ARGV[6]
  created = 1
end
redis.call('HSET', KEYS[1],
  'agent', ARGV[1], 'provider', ARGV[2], 'endpoint', ARGV[3], 'tier', ARGV[4],
  'session', ARGV[5], 'registered_at', registered_at, 'updated_at', ARGV[6])
redis.call('HDEL', KEYS[1], 'webhook_secret')
local now = redis.call('TIME')
redis.call('HSET', KEYS[1], 'seen_at', now[1] * 1000 + math.floor(now[2] / 1000))
local ok = redis.pcall('XGROUP', 'CREATE', KEYS[2], ARGV[7], '0', 'MKSTREAM')
if type(ok) == 'table' and ok.err and not string.find(ok.err, 'BUSYGROUP', 1, true) then
  return redis.error_reply(ok.err)
end
if previous[1] and previous[1] ~= ARGV[5] then
  local kept, most = {previous[1]}, tonumber(ARGV[9])
  for s in string.gmatch(previous[3] or '', '%S+') do
    if #kept >= most then
      break
    end
    if s ~= ARGV[5] and s ~= previous[1] then
      kept[#kept + 1] = s
    end
  end
  redis.call('HSET', KEYS[1], 'superseded', table.concat(kept, ' '))
  redis.call('PUBLISH', ARGV[8], ARGV[1])
end
return {previous[1] or '', registered_at, created}
