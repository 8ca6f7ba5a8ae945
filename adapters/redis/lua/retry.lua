-- retry.lua: re-claim envelopes a consumer holds to that same consumer: another attempt, a touch, or
-- a release.
-- KEYS[1] inbox stream
-- ARGV[1] consumer group   ARGV[2] consumer name   ARGV[3] mode: 'retry', 'touch' or 'release'
-- ARGV[4..] stream entry id, nonce pairs (decoded from envelope ids)
-- An entry is re-claimed only if it exists, its nonce matches and this consumer holds it in the PEL, so
-- an envelope another consumer took over after the visibility timeout is never taken back.
-- 'retry' uses XCLAIM with min-idle 0: the delivery count goes up by one and the idle time restarts.
-- 'touch' adds JUSTID, which restarts the idle time without counting a delivery.
-- 'release' adds JUSTID and IDLE of a year: the entry looks abandoned, so the next claim of any
-- consumer takes it over at once (a loop that stops hands back what it claimed but never started).
-- Returns one number per pair: the delivery count after the re-claim, or 0 when not held.
local group, consumer, mode = ARGV[1], ARGV[2], ARGV[3]
local year_ms = 365 * 24 * 3600 * 1000
local out = {}
for i = 4, #ARGV, 2 do
  local id, nonce = ARGV[i], ARGV[i + 1]
  local count = 0
  local row = redis.call('XPENDING', KEYS[1], group, id, id, 1)[1]
  if row and row[2] == consumer then
    local matches = entry_with_nonce(KEYS[1], id, nonce) ~= nil
    if matches then
      if mode == 'touch' then
        redis.call('XCLAIM', KEYS[1], group, consumer, 0, id, 'JUSTID')
        count = row[4]
      elseif mode == 'release' then
        redis.call('XCLAIM', KEYS[1], group, consumer, 0, id, 'IDLE', year_ms, 'JUSTID')
        count = row[4]
      else
        redis.call('XCLAIM', KEYS[1], group, consumer, 0, id)
        count = row[4] + 1
      end
    end
  end
  out[#out + 1] = count
end
return out
