-- purge.lua: drop the oldest envelopes of an inbox (relay inbox purge, retire --purge), on its slot.
-- Built by adapters/redis/protocol_inbox.py (purge_call), which reads the reply (Purged).
local inbox = KEYS[1] -- inbox stream
local outcomes = KEYS[2] -- outcome hash of the day (the senders' status)
local group = ARGV[1] -- consumer group
local upto = ARGV[2] -- the newest entry id to drop ('+' = whatever is there)
local batch = tonumber(ARGV[3]) -- entries dropped at most by this call
local until_ms = ARGV[4] -- when outcome records expire (ms since the epoch; 0 = no records)
-- Up to `batch` of the oldest entries (handed out or not) are acknowledged and deleted, each recorded
-- for its sender's status as '<entry id> <deliveries> purged' (entry_outcomes, _entry.lua); nothing
-- goes to the history or the dead letters. A caller drops a whole inbox by calling again while
-- `more` is 1 (each call bounded; what is sent meanwhile arrives after `upto` and stays).
-- Returns {dropped, more (1|0)}.
local entries = redis.call('XRANGE', inbox, '-', upto, 'COUNT', batch)
if #entries == 0 then
  return {0, 0}
end
local counts = entry_deliveries(inbox, group, entries)
local ids, records = {}, {}
for _, e in ipairs(entries) do
  ids[#ids + 1] = e[1]
  records[#records + 1] = entry_field(e[2], 'nonce') or ''
  records[#records + 1] = e[1] .. ' ' .. (counts[e[1]] or 0) .. ' purged'
end
redis.pcall('XACK', inbox, group, unpack(ids)) -- an inbox without its group has nothing pending
redis.call('XDEL', inbox, unpack(ids))
entry_outcomes(outcomes, until_ms, records)
local more = 0
if #entries == batch then
  more = 1
end
return {#entries, more}
