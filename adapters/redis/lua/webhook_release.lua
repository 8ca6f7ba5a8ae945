-- webhook_release.lua: give up an agent's notifier claim, if it is still ours.
-- KEYS[1] claim string   ARGV[1] holder
-- Returns 1 when released, 0 when the claim had lapsed or belongs to another holder.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
