-- sweep.lua: move expired envelopes among the oldest of one inbox to its dead letters (reason 'expired').
-- KEYS[1] inbox stream   KEYS[2] dead-letter stream   KEYS[3] outcome hash of the day
-- KEYS[4] per-agent counts hash
-- ARGV[1] consumer group   ARGV[2] now (ms since the epoch)   ARGV[3] dead_at (ISO-8601 UTC)
-- ARGV[4] when outcome records expire (ms since the epoch; 0 = no records)
-- ARGV[5] how many of the oldest entries to look at
-- Bounded: looks at ARGV[5] entries at most, so a sweep never blocks the node for long; fetch.lua
-- enforces expiry on everything it hands out, the sweep only keeps expired mail from filling an inbox.
-- Returns a flat list: tier, 'expired' for every entry moved.
local group, now = ARGV[1], tonumber(ARGV[2])
local dropped = {}
for _, e in ipairs(redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', tonumber(ARGV[5]))) do
  if entry_expired(e[2], now) then
    local row = redis.pcall('XPENDING', KEYS[1], group, e[1], e[1], 1)
    local attempts = 0
    if type(row) == 'table' and not row.err and row[1] then
      attempts = row[1][4]
    end
    entry_dead(KEYS[1], KEYS[2], group, e, attempts, 'expired', ARGV[3], KEYS[3], ARGV[4])
    redis.call('HINCRBY', KEYS[4], 'expired', 1)
    dropped[#dropped + 1] = entry_field(e[2], 'tier') or 'network'
    dropped[#dropped + 1] = 'expired'
  end
end
return dropped
