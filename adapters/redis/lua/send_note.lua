-- send_note.lua: note a sent envelope in its sender's status index, on the sender's slot.
-- Built by adapters/redis/protocol.py (send_call).
local day_index = KEYS[1] -- the sender's status index of the day
local nonce = ARGV[1]
local index_value = ARGV[2] -- "<recipient> <sent_at ms>"
local index_until = ARGV[3] -- when the index expires (ms since the epoch)
-- Only for a repeated idempotency key whose first attempt claimed the key but never landed: step 1
-- saw the claim and noted nothing, and step 2 stored the envelope. Returns 1.
redis.call('HSET', day_index, nonce, index_value)
redis.call('PEXPIREAT', day_index, index_until)
return 1
