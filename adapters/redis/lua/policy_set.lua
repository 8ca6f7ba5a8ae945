-- policy_set.lua: replace an agent's contact policy (broker/policy.py, docs/policy.md) in one step.
-- Built by adapters/redis/policy.py.
local policy = KEYS[1] -- the agent's policy hash (keys.py: policy)
local kind_new = ARGV[1] -- 'open' (delete the hash), 'registered' or 'list'
local listed = {unpack(ARGV, 2)} -- a list's agent ids
-- Returns the policy it replaced: {kind, listed ids...} (kind 'open' when there was none). One script,
-- so a send on the same slot sees either the old policy or the new one, never a part of either.
local old = redis.call('HGETALL', policy)
local kind = 'open'
local ids = {}
for i = 1, #old, 2 do
  if old[i] == '=accept_from' then
    kind = old[i + 1]
  elseif string.sub(old[i], 1, 1) ~= '=' then
    ids[#ids + 1] = old[i]
  end
end
redis.call('DEL', policy)
if kind_new ~= 'open' then
  local fields = {'=accept_from', kind_new, '=listed', #listed}
  for _, id in ipairs(listed) do
    fields[#fields + 1] = id
    fields[#fields + 1] = '1'
  end
  redis.call('HSET', policy, unpack(fields))
end
table.insert(ids, 1, kind)
return ids
