-- webhook_release.lua: give up an agent's notifier claim, if it is still ours.
-- Built by adapters/redis/protocol_operator.py (webhook_release_call).
local claim_key = KEYS[1] -- claim string
local holder = ARGV[1]
-- Returns 1 when released, 0 when the claim had lapsed or belongs to another holder.
if redis.call('GET', claim_key) == holder then
  return redis.call('DEL', claim_key)
end
return 0
