-- send_refund.lua: undo step 1 of a send that step 2 refused (unknown recipient, full inbox).
-- KEYS[1] sender rate-limit hash   ARGV[1] burst (bucket size)
-- Gives back the rate token send_check.lua took (never above the bucket size). Returns 1, or 0 when
-- the bucket is gone (it expired: it is full anyway).
local tokens = tonumber(redis.call('HGET', KEYS[1], 'tokens'))
if not tokens then
  return 0
end
redis.call('HSET', KEYS[1], 'tokens', tostring(math.min(math.max(tonumber(ARGV[1]), 1), tokens + 1)))
return 1
