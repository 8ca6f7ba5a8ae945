-- _session.lua: the one session check, prepended to the scripts that act for a caller's session
-- (fetch, ack, send_check, status_index, notice; adapters/redis/scripts.py). A registration hash
-- holds 'session' (the live one) and 'superseded' (sessions it replaced, newest first,
-- space-separated, as many as register.lua keeps). Session ids never contain spaces (broker/ids.py).
-- nil when `caller` may act ("" = do not check), else the error reply to return:
-- RELAY_RETIRED (no registration: an operator retired the agent, and `caller` is one of the sessions
-- it had then, or "": the hash `retired`, field 'sessions', retire.lua), RELAY_UNREGISTERED (no
-- registration), RELAY_SUPERSEDED (`caller` was replaced by a newer session),
-- RELAY_SESSION_UNREGISTERED (`caller` never registered: another session holds the registration).
-- `retired` is only read when there is no registration, so a registered caller pays nothing for it.
local function session_refusal(live, superseded, caller, retired)
  if not live then
    local sessions = redis.call('HGET', retired, 'sessions')
    if sessions and (caller == '' or string.find(' ' .. sessions .. ' ', ' ' .. caller .. ' ', 1, true)) then
      return redis.error_reply('RELAY_RETIRED')
    end
    return redis.error_reply('RELAY_UNREGISTERED')
  end
  if caller == '' or live == caller then
    return nil
  end
  if superseded and string.find(' ' .. superseded .. ' ', ' ' .. caller .. ' ', 1, true) then
    return redis.error_reply('RELAY_SUPERSEDED')
  end
  return redis.error_reply('RELAY_SESSION_UNREGISTERED')
end
-- record seen_at (ms of Redis TIME) in the registration hash: the agent's last fetch or acknowledgement.
-- Bookkeeping, so it never stands in the way: called after the script's real work, and skipped when
-- Redis refuses it (run as EVAL at maxmemory, adapters/redis/scripts.py, Redis refuses a script's
-- first write that adds memory; XREADGROUP, XACK and XDEL are not such writes, so a fetch or an
-- acknowledgement still runs, and after them this write is let through too).
-- `now_ms`: the Redis time the script already read (ms), nil to read it here.
local function note_seen(registration, now_ms)
  if not now_ms then
    local now = redis.call('TIME')
    now_ms = now[1] * 1000 + math.floor(now[2] / 1000)
  end
  redis.pcall('HSET', registration, 'seen_at', now_ms)
end
