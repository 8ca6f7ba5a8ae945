-- send.lua: a whole send in one call, on a single Redis only (its keys span two agents' slots, which
-- a cluster refuses). Built by adapters/redis/scripts.py from the same sources as the two steps:
-- send_check, send_append, send_refund and send_note become local functions of this script, so a send
-- means the same in one call as in two, and nothing at all is written when it is refused.
-- KEYS: send_check's keys, then send_append's   ARGV[1] how many KEYS are send_check's
-- ARGV[2] how many ARGV follow for send_check (then send_append's, with '' as the sender tier and
-- the sender's provider, which step 1 fills in)
-- Returns send_append's reply. Errors: those of send_check and send_append.
local nk, na = tonumber(ARGV[1]), tonumber(ARGV[2])
local check_keys, append_keys, check_args, append_args = {}, {}, {}, {}
for i = 1, #KEYS do
  if i <= nk then check_keys[#check_keys + 1] = KEYS[i] else append_keys[#append_keys + 1] = KEYS[i] end
end
for i = 3, #ARGV do
  if i <= na + 2 then check_args[#check_args + 1] = ARGV[i] else append_args[#append_args + 1] = ARGV[i] end
end
local checked = send_check(check_keys, check_args)
if checked.err then
  return checked
end
append_args[2] = checked[1]
append_args[#append_args] = checked[3]
local appended = send_append(append_keys, append_args)
local claimed = check_args[4] ~= ''
if appended.err then
  local burst = '0'
  if checked[2] == 0 and tonumber(check_args[2]) > 0 then
    burst = check_args[3]
  end
  local undo = {check_keys[2], check_keys[3]}
  if claimed then
    undo[3] = check_keys[4]
  end
  send_refund(undo, {burst, check_args[6], claimed and '1' or '0'})
  return appended
end
if checked[2] == 1 and appended[5] == 0 and check_args[8] ~= '0' then
  send_note({check_keys[3]}, {appended[3], check_args[7], check_args[8]})
end
return appended
