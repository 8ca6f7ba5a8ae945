-- fetch.lua: the caller's unacknowledged envelopes, oldest first: pending ones, then new ones.
-- KEYS[1] registration hash   KEYS[2] inbox stream
-- ARGV[1] session ("" = do not check)   ARGV[2] consumer group   ARGV[3] consumer name   ARGV[4] count
-- Returns a flat list: for each entry {id, {field, value, ...}, deliveries, first (1|0)}.
-- Records seen_at (ms of Redis TIME) in the registration hash: the agent's last fetch.
-- Errors: RELAY_UNREGISTERED, RELAY_SUPERSEDED, RELAY_SESSION_UNREGISTERED (_session.lua).
local registered = redis.call('HMGET', KEYS[1], 'session', 'superseded')
local refused = session_refusal(registered[1], registered[2], ARGV[1])
if refused then
  return refused
end
local now = redis.call('TIME')
redis.call('HSET', KEYS[1], 'seen_at', now[1] * 1000 + math.floor(now[2] / 1000))
local group, consumer, count = ARGV[2], ARGV[3], tonumber(ARGV[4])
local function read(from, n)
  local reply = redis.pcall('XREADGROUP', 'GROUP', group, consumer, 'COUNT', n, 'STREAMS', KEYS[2], from)
  if type(reply) == 'table' and reply.err then
    if not string.find(reply.err, 'NOGROUP', 1, true) then
      return redis.error_reply(reply.err)
    end
    redis.call('XGROUP', 'CREATE', KEYS[2], group, '0', 'MKSTREAM')
    reply = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', n, 'STREAMS', KEYS[2], from)
  end
  if not reply or not reply[1] then
    return {}
  end
  return reply[1][2]
end
local out = {}
local pending = read('0', count)
if pending.err then
  return pending
end
local kept = 0
if #pending > 0 then
  local counts = {}
  local detail = redis.call('XPENDING', KEYS[2], group, pending[1][1], pending[#pending][1], #pending, consumer)
  for _, row in ipairs(detail) do
    counts[row[1]] = row[4]
  end
  for _, e in ipairs(pending) do
    if e[2] then
      out[#out + 1] = {e[1], e[2], counts[e[1]] or 2, 0}
      kept = kept + 1
    else
      -- deleted by hand while pending: nothing left to deliver, so release it
      redis.call('XACK', KEYS[2], group, e[1])
    end
  end
end
if #pending < count then
  local fresh = read('>', count - #pending)
  if fresh.err then
    return fresh
  end
  for _, e in ipairs(fresh) do
    out[#out + 1] = {e[1], e[2], 1, 1}
  end
end
return out
