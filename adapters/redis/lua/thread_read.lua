-- thread_read.lua: one agent's part of a thread read, read-only: per envelope asked, the envelope when
-- this agent holds it (its inbox, else its history) and the replies to it this agent received.
-- Built by adapters/redis/protocol_operator.py (thread_read_call), read by ThreadPart.read_all.
local inbox = KEYS[1] -- inbox stream
local history = KEYS[2] -- history stream
local at = KEYS[3] -- history positions hash (inbox entry id -> history id, or '=<entry id> <nonce>')
local group = ARGV[1] -- consumer group
local hops = tonumber(ARGV[2]) -- requeues followed at most
local first = 3 -- ARGV[3..]: per envelope: entry id, nonce, envelope id, "<i> <j>" (KEYS positions of
-- the replies index hashes of the days it may be noted under)
-- An envelope is looked for in the inbox (the nonce must match), else through its position in the
-- history; a requeued dead letter's old position names the entry it became, followed up to `hops`.
-- Returns per envelope {where, id, fields, deliveries, replies}: where 'inbox' (id = entry id,
-- deliveries from XPENDING), 'history' (id = history id; the fields carry entry_id, attempts, outcome)
-- or '' (not held here); replies: the ids of the replies this agent received, space-separated.
local out = {}
for i = first, #ARGV, 4 do
  local id, nonce, envelope, days = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local replies = {}
  for k in string.gmatch(days, '%d+') do
    local found = redis.call('HGET', KEYS[tonumber(k)], envelope)
    if found then
      replies[#replies + 1] = found
    end
  end
  local row = {'', '', {}, 0, table.concat(replies, ' ')}
  for _ = 0, hops do
    local fields = entry_with_nonce(inbox, id, nonce)
    if fields then
      local pending = redis.pcall('XPENDING', inbox, group, id, id, 1)
      local count = 0
      if type(pending) == 'table' and not pending.err and pending[1] then
        count = pending[1][4]
      end
      row = {'inbox', id, fields, count, row[5]}
      break
    end
    local position = redis.call('HGET', at, id)
    if not position then
      break
    end
    if string.sub(position, 1, 1) == '=' then
      id, nonce = string.match(position, '^=(%S+) (%S+)$')
    else
      local kept = redis.call('XRANGE', history, position, position)[1]
      if kept and entry_field(kept[2], 'nonce') == nonce then
        row = {'history', kept[1], kept[2], 0, row[5]}
      end
      break
    end
  end
  out[#out + 1] = row
end
return out
