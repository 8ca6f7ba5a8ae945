-- fetch.lua: the caller's unacknowledged envelopes, oldest first: pending ones, then new ones.
-- Built by adapters/redis/protocol_inbox.py (fetch_call), which reads the reply (Fetch).
local registration = KEYS[1] -- registration hash
local inbox = KEYS[2] -- inbox stream
local dead = KEYS[3] -- dead-letter stream
local outcomes = KEYS[4] -- outcome hash of the day (the senders' status)
local counts_key = KEYS[5] -- per-agent counts hash
local history = KEYS[6] -- the agent's history stream
local at = KEYS[7] -- the history positions hash
local retired = KEYS[8] -- the agent's retirement (retire.lua), read only when it has no registration
local session = ARGV[1] -- "" = do not check
local group = ARGV[2] -- consumer group
local consumer = ARGV[3] -- consumer name
local count = tonumber(ARGV[4])
local now = tonumber(ARGV[5]) -- ms since the epoch
local max_deliveries = tonumber(ARGV[6]) -- 0 = no limit
local dead_at = ARGV[7] -- ISO-8601, as dead letters store it
local until_ms = ARGV[8] -- when outcome records expire (ms since the epoch; 0 = no records)
local keep_ms = ARGV[9] -- history retention (ms; 0 = keep no history)
local max_bytes = ARGV[10] -- the history's field bytes at most (0 = no cap)
-- An entry whose expires_at has passed is never handed out: it moves to the dead letters with reason
-- 'expired'. A pending entry that was already handed out max-deliveries times moves there with reason
-- 'max_deliveries' instead of coming back. Each move adds one to that reason's field in the counts hash
-- and keeps the envelope in the history (entry_dead, _entry.lua).
-- Records seen_at (note_seen, _session.lua). Works at maxmemory (allow-oom), and so does its EVAL
-- form (adapters/redis/scripts.py): its first writes are XREADGROUP's, which Redis does not refuse
-- there (the dead-letter moves after them are let through too).
-- Returns {rows, dropped}: rows is a flat list, for each entry {id, {field, value, ...}, deliveries,
-- first (1|0)}; dropped is a flat list of tier, reason for every entry moved to the dead letters.
-- Errors: RELAY_RETIRED, RELAY_UNREGISTERED, RELAY_SUPERSEDED, RELAY_SESSION_UNREGISTERED (_session.lua).
local registered = redis.call('HMGET', registration, 'session', 'superseded')
local refused = session_refusal(registered[1], registered[2], session, retired)
if refused then
  return refused
end
local function read(from, n)
  local reply = redis.pcall('XREADGROUP', 'GROUP', group, consumer, 'COUNT', n, 'STREAMS', inbox, from)
  if type(reply) == 'table' and reply.err then
    if not string.find(reply.err, 'NOGROUP', 1, true) then
      return redis.error_reply(reply.err)
    end
    redis.call('XGROUP', 'CREATE', inbox, group, '0', 'MKSTREAM')
    reply = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', n, 'STREAMS', inbox, from)
  end
  if not reply or not reply[1] then
    return {}
  end
  return reply[1][2]
end
local out, dropped = {}, {}
local function drop(e, attempts, reason)
  entry_dead(inbox, dead, group, e, attempts, reason, dead_at, outcomes, until_ms, history, at, keep_ms, max_bytes)
  redis.call('HINCRBY', counts_key, reason, 1)
  dropped[#dropped + 1] = entry_field(e[2], 'tier') or 'network'
  dropped[#dropped + 1] = reason
end
local pending = read('0', count)
if pending.err then
  return pending
end
if #pending > 0 then
  local counts = {}
  local detail = redis.call('XPENDING', inbox, group, pending[1][1], pending[#pending][1], #pending, consumer)
  for _, row in ipairs(detail) do
    counts[row[1]] = row[4]
  end
  for _, e in ipairs(pending) do
    if e[2] then
      -- reading the pending entry counted one more delivery: it was handed out n - 1 times before
      local n = counts[e[1]] or 2
      if entry_expired(e[2], now) then
        drop(e, n - 1, 'expired')
      elseif max_deliveries > 0 and n > max_deliveries then
        drop(e, n - 1, 'max_deliveries')
      else
        out[#out + 1] = {e[1], e[2], n, 0}
      end
    else
      -- deleted by hand while pending: nothing left to deliver, so release it
      redis.call('XACK', inbox, group, e[1])
    end
  end
end
-- new entries; expired ones are moved aside and the gap refilled, a bounded number of times
local exhausted = #pending >= count
for _ = 1, 8 do
  if exhausted or #out >= count then
    break
  end
  local fresh = read('>', count - #out)
  if fresh.err then
    return fresh
  end
  local moved = false
  for _, e in ipairs(fresh) do
    if entry_expired(e[2], now) then
      drop(e, 0, 'expired')
      moved = true
    else
      out[#out + 1] = {e[1], e[2], 1, 1}
    end
  end
  exhausted = not moved
end
note_seen(registration)
return {out, dropped}
