-- sweep.lua: move expired envelopes among the oldest of one inbox to its dead letters (reason 'expired').
-- Built by adapters/redis/protocol_inbox.py (sweep_call), which reads the reply (dropped).
local inbox = KEYS[1] -- inbox stream
local dead = KEYS[2] -- dead-letter stream
local outcomes = KEYS[3] -- outcome hash of the day
local counts_key = KEYS[4] -- per-agent counts hash
local history = KEYS[5] -- the agent's history stream
local at = KEYS[6] -- the history positions hash
local group = ARGV[1] -- consumer group
local now = tonumber(ARGV[2]) -- ms since the epoch
local dead_at = ARGV[3] -- ISO-8601 UTC, as dead letters store it
local until_ms = ARGV[4] -- when outcome records expire (ms since the epoch; 0 = no records)
local look_at = tonumber(ARGV[5]) -- how many of the oldest entries to look at
local keep_ms = ARGV[6] -- history retention (ms; 0 = keep no history)
local max_bytes = ARGV[7] -- the history's field bytes at most (0 = no cap)
-- Bounded: looks at look_at entries at most, so a sweep never blocks the node for long; fetch.lua
-- enforces expiry on everything it hands out, the sweep only keeps expired mail from filling an inbox.
-- Returns a flat list: tier, 'expired' for every entry moved.
local dropped = {}
for _, e in ipairs(redis.call('XRANGE', inbox, '-', '+', 'COUNT', look_at)) do
  if entry_expired(e[2], now) then
    local row = redis.pcall('XPENDING', inbox, group, e[1], e[1], 1)
    local attempts = 0
    if type(row) == 'table' and not row.err and row[1] then
      attempts = row[1][4]
    end
    entry_dead(inbox, dead, group, e, attempts, 'expired', dead_at, outcomes, until_ms, history, at, keep_ms, max_bytes)
    redis.call('HINCRBY', counts_key, 'expired', 1)
    dropped[#dropped + 1] = entry_field(e[2], 'tier') or 'network'
    dropped[#dropped + 1] = 'expired'
  end
end
return dropped
