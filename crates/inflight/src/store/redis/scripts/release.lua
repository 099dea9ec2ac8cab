-- release.lua: gives a lease back; releasing twice is not an error.
-- KEYS[1] leases, KEYS[2] weights; ARGV[1] permit id, ARGV[2] clock offset ms
-- Returns 1 when a live lease was released, 0 when it was already gone (released or expired).
-- Atomic so that the lease and its weight leave together.
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
forget_weight(KEYS[2], ARGV[1])
if tonumber(score) <= now_ms(tonumber(ARGV[2])) then return 0 end
return 1
