-- policy_set.lua: replace an agent's contact policy (broker/policy.py, docs/policy.md) in one step.
-- KEYS[1] the agent's policy hash (keys.py: policy)
-- ARGV[1] the new kind: 'open' (delete the hash), 'registered' or 'list'   ARGV[2..] a list's agent ids
-- Returns the policy it replaced: {kind, listed ids...} (kind 'open' when there was none). One script,
-- so a send on the same slot sees either the old policy or the new one, never a part of either.
local old = redis.call('HGETALL', KEYS[1])
local kind = 'open'
local ids = {}
for i = 1, #old, 2 do
  if old[i] == '=accept_from' then
    kind = old[i + 1]
  elseif string.sub(old[i], 1, 1) ~= '=' then
    ids[#ids + 1] = old[i]
  end
end
redis.call('DEL', KEYS[1])
if ARGV[1] ~= 'open' then
  local fields = {'=accept_from', ARGV[1], '=listed', #ARGV - 1}
  for i = 2, #ARGV do
    fields[#fields + 1] = ARGV[i]
    fields[#fields + 1] = '1'
  end
  redis.call('HSET', KEYS[1], unpack(fields))
end
table.insert(ids, 1, kind)
return ids
