-- send_note.lua: note a sent envelope in its sender's status index, on the sender's slot.
-- KEYS[1] the sender's status index of the day   ARGV[1] nonce   ARGV[2] "<recipient> <sent_at ms>"
-- ARGV[3] when the index expires (ms since the epoch)
-- Only for a repeated idempotency key whose first attempt claimed the key but never landed: step 1
-- saw the claim and noted nothing, and step 2 stored the envelope. Returns 1.
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('PEXPIREAT', KEYS[1], ARGV[3])
return 1
