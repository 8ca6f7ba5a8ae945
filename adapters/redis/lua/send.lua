-- send.lua: a whole send in one call, on a single Redis only (its keys span two agents' slots, which
-- a cluster refuses). Built by adapters/redis/scripts.py from the same sources as the two steps:
-- send_check, send_append, send_refund and send_note become local functions of this script, so a send
-- means the same in one call as in two, and nothing at all is written when it is refused.
-- Its KEYS and ARGV are the four calls' (adapters/redis/protocol.py, SendCall.combined):
local counts = {} -- ARGV[1..4] how many KEYS, ARGV[5..8] how many ARGV each call takes
for i = 1, 8 do
  counts[i] = tonumber(ARGV[i])
end
-- KEYS: send_check's, send_append's, send_refund's, send_note's; ARGV[9..]: their ARGV, in that order
local function parts(list, at, first)
  local out = {}
  for i = first, first + 3 do
    out[#out + 1] = {unpack(list, at + 1, at + counts[i])}
    at = at + counts[i]
  end
  return out
end
local keys, args = parts(KEYS, 0, 1), parts(ARGV, 8, 5)
-- Returns send_append's reply. Errors: those of send_check and send_append.
local checked = send_check(keys[1], args[1])
if checked.err then
  return checked
end
args[2][2] = checked[1] -- send_append's sender_tier
args[2][#args[2]] = checked[4] -- send_append's sender_provider (its last ARGV)
local appended = send_append(keys[2], args[2])
if appended.err then
  args[3][1] = checked[3] -- send_refund's burst: the token send_check took
  send_refund(keys[3], args[3])
  return appended
end
if checked[2] == 1 and appended[5] == 0 and #args[4] > 0 then
  send_note(keys[4], args[4])
end
return appended
