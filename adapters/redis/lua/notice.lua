-- notice.lua: announce what an agent was not told about ("mail pending"); reads the inbox, never the
-- Built by adapters/redis/protocol_inbox.py (notice_call), which reads the reply (Announcement).
local registration = KEYS[1] -- registration hash
local inbox = KEYS[2] -- inbox stream
local notice = KEYS[3] -- notice hash (session, cursor, at)
local retired = KEYS[4] -- the agent's retirement (retire.lua), read only when it has no registration
local session = ARGV[1]
local remind = tonumber(ARGV[2]) -- remind after, ms (0 = never)
local listed = tonumber(ARGV[3]) -- envelopes to list
local most = tonumber(ARGV[4]) -- envelopes to announce at most
local seen = ARGV[5] -- '1': the agent's own wait, which records seen_at (note_seen, _session.lua)
-- The cursor (the newest entry id announced) belongs to one session: another session starts again
-- from the oldest entry. Entries after the cursor are announced and the cursor moves past them; with
-- nothing new, a reminder of the unacknowledged entries is due `remind after` ms after the last notice.
-- Times are Redis's (TIME), so every worker agrees. At maxmemory the function runs (allow-oom) and
-- writes the cursor; run as EVAL there (adapters/redis/scripts.py) Redis refuses the cursor's write (the
-- script's first): the notice is answered all the same, and the next wait announces that mail again
-- (told twice rather than never while inboxes are full).
-- Returns {count, unacknowledged, reminder (1|0), ms until a reminder is due (-1 = none),
--          {{entry id, {field, value, ...}}, ...} (the oldest announced, at most listed)}.
-- Errors (nothing written): RELAY_RETIRED, RELAY_UNREGISTERED, RELAY_SUPERSEDED, RELAY_SESSION_UNREGISTERED
-- (_session.lua).
local registered = redis.call('HMGET', registration, 'session', 'superseded')
local refused = session_refusal(registered[1], registered[2], session, retired)
if refused then
  return refused
end
if seen == '1' then
  note_seen(registration)
end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local state = redis.call('HMGET', notice, 'session', 'cursor', 'at')
local cursor, at = '0-0', 0
if state[1] == session and state[2] then
  cursor, at = state[2], tonumber(state[3]) or 0
end
local unacknowledged = redis.call('XLEN', inbox)
local function head(entries)
  local out = {}
  for i = 1, math.min(#entries, listed) do
    out[i] = {entries[i][1], entries[i][2]}
  end
  return out
end
local fresh = redis.call('XRANGE', inbox, '(' .. cursor, '+', 'COUNT', most)
if #fresh > 0 then
  redis.pcall('HSET', notice, 'session', session, 'cursor', fresh[#fresh][1], 'at', now)
  return {#fresh, unacknowledged, 0, -1, head(fresh)}
end
if unacknowledged == 0 or remind <= 0 then
  return {0, unacknowledged, 0, -1, {}}
end
local due = at + remind - now
if due > 0 then
  return {0, unacknowledged, 0, due, {}}
end
redis.pcall('HSET', notice, 'at', now)
local oldest = redis.call('XRANGE', inbox, '-', '+', 'COUNT', listed)
return {math.min(unacknowledged, most), unacknowledged, 1, -1, head(oldest)}
