-- send_refund.lua: undo step 1 of a send that step 2 refused (unknown recipient, full inbox).
-- Built by adapters/redis/protocol.py (send_call, with_refund).
local bucket_key = KEYS[1] -- sender rate-limit hash
local day_index = KEYS[2] -- the sender's status index of the day
local claim_key = KEYS[3] -- the idempotency claim, only when claimed is '1'
local burst = ARGV[1] -- bucket size ('0' = no token was taken; send_check.lua's third reply)
local nonce = ARGV[2]
local claimed = ARGV[3] -- 1|0
-- Gives back the rate token send_check.lua took (never above the bucket size), forgets the nonce in the
-- status index and releases the idempotency claim, so the same key may be sent again. Returns 1.
if burst ~= '0' then
  local tokens = tonumber(redis.call('HGET', bucket_key, 'tokens'))
  if tokens then
    redis.call('HSET', bucket_key, 'tokens', tostring(math.min(math.max(tonumber(burst), 1), tokens + 1)))
  end
end
redis.call('HDEL', day_index, nonce)
if claimed == '1' then
  redis.call('DEL', claim_key)
end
return 1
