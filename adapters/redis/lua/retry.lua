-- retry.lua: re-claim envelopes a consumer holds to that same consumer: another attempt, a touch, or
-- Built by adapters/redis/protocol_delivery.py (retry_call).
local inbox = KEYS[1] -- inbox stream
local group = ARGV[1] -- consumer group
local consumer = ARGV[2] -- consumer name
local mode = ARGV[3] -- 'retry', 'touch' or 'release'
local first_pair = 4 -- ARGV[4..]: stream entry id, nonce pairs (decoded from envelope ids)
-- An entry is re-claimed only if it exists, its nonce matches and this consumer holds it in the PEL, so
-- an envelope another consumer took over after the visibility timeout is never taken back.
-- 'retry' uses XCLAIM with min-idle 0: the delivery count goes up by one and the idle time restarts.
-- 'touch' adds JUSTID, which restarts the idle time without counting a delivery.
-- 'release' adds JUSTID and IDLE of a year: the entry looks abandoned, so the next claim of any
-- consumer takes it over at once (a loop that stops hands back what it claimed but never started).
-- Returns one number per pair: the delivery count after the re-claim, or 0 when not held.
local year_ms = 365 * 24 * 3600 * 1000
local out = {}
for i = first_pair, #ARGV, 2 do
  local id, nonce = ARGV[i], ARGV[i + 1]
  local count = 0
  local row = redis.call('XPENDING', inbox, group, id, id, 1)[1]
  if row and row[2] == consumer then
    local matches = entry_with_nonce(inbox, id, nonce) ~= nil
    if matches then
      if mode == 'touch' then
        redis.call('XCLAIM', inbox, group, consumer, 0, id, 'JUSTID')
        count = row[4]
      elseif mode == 'release' then
        redis.call('XCLAIM', inbox, group, consumer, 0, id, 'IDLE', year_ms, 'JUSTID')
        count = row[4]
      else
        redis.call('XCLAIM', inbox, group, consumer, 0, id)
        count = row[4] + 1
      end
    end
  end
  out[#out + 1] = count
end
return out
