-- retire.lua: end an agent's registration (relay agents retire), on the agent's slot.
-- Built by adapters/redis/protocol_operator.py (retire_call), which reads the reply (Retirement).
local registration = KEYS[1] -- registration hash
local retired = KEYS[2] -- the retirement hash: at (ms of Redis TIME), sessions (space-separated)
local notice = KEYS[3] -- the mail-pending cursor (it belonged to the retired session)
local inbox = KEYS[4] -- inbox stream
local dead = KEYS[5] -- dead-letter stream
local history = KEYS[6] -- history stream
local at = KEYS[7] -- history positions hash
local counts = KEYS[8] -- per-agent counts hash
local agent = ARGV[1]
local wake_channel = ARGV[2]
local most = tonumber(ARGV[3]) -- sessions the retirement names at most (the live one, then superseded)
local purge = ARGV[4] -- '1': also delete the dead letters, the history and its positions, the counts
-- The registration hash goes (webhook secret included) and the retirement names the sessions it had:
-- send_append.lua then finds no registration (RELAY_UNKNOWN_RECIPIENT) and _session.lua refuses those
-- sessions (RELAY_RETIRED). A send is appended before this script or refused after it: never both.
-- The agent's parked long-polls are woken (they look again and are refused). The inbox is kept: with
-- purge, purge.lua drops it afterwards, up to the entry id this returns (each envelope recorded
-- 'purged'); nothing can be appended meanwhile, as no registration is left to append under.
-- An agent already retired is retired again without change (with purge: purged).
-- Returns {retired now (1|0), the retirement's sessions, the inbox's newest entry id ('' = empty or no
-- purge)}. Errors: RELAY_UNREGISTERED (neither registered nor retired: nothing written).
local live = redis.call('HMGET', registration, 'session', 'superseded')
local now = 0
if live[1] then
  local sessions = {live[1]}
  for s in string.gmatch(live[2] or '', '%S+') do
    if #sessions >= most then
      break
    end
    if s ~= live[1] then
      sessions[#sessions + 1] = s
    end
  end
  local clock = redis.call('TIME')
  -- the retirement first: at maxmemory Redis refuses this write, and then nothing is written at all
  redis.call('HSET', retired, 'at', clock[1] * 1000 + math.floor(clock[2] / 1000), 'sessions', table.concat(sessions, ' '))
  redis.call('DEL', registration, notice)
  redis.call('PUBLISH', wake_channel, agent)
  now = 1
elseif redis.call('EXISTS', retired) == 0 then
  return redis.error_reply('RELAY_UNREGISTERED')
end
local newest = ''
if purge == '1' then
  redis.call('UNLINK', dead, history, at, counts)
  local top = redis.call('XREVRANGE', inbox, '+', '-', 'COUNT', 1)[1]
  if top then
    newest = top[1]
  end
end
return {now, redis.call('HGET', retired, 'sessions') or '', newest}
