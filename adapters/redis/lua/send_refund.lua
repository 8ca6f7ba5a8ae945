-- send_refund.lua: undo step 1 of a send that step 2 refused (unknown recipient, full inbox).
-- KEYS[1] sender rate-limit hash   KEYS[2] the sender's status index of the day
-- KEYS[3] the idempotency claim, only when ARGV[3] is '1'
-- ARGV[1] burst (bucket size; 0 = no token was taken)   ARGV[2] nonce   ARGV[3] claimed (1|0)
-- Gives back the rate token send_check.lua took (never above the bucket size), forgets the nonce in the
-- status index and releases the idempotency claim, so the same key may be sent again. Returns 1.
if ARGV[1] ~= '0' then
  local tokens = tonumber(redis.call('HGET', KEYS[1], 'tokens'))
  if tokens then
    redis.call('HSET', KEYS[1], 'tokens', tostring(math.min(math.max(tonumber(ARGV[1]), 1), tokens + 1)))
  end
end
redis.call('HDEL', KEYS[2], ARGV[2])
if ARGV[3] == '1' then
  redis.call('DEL', KEYS[3])
end
return 1
