-- busy.lua: the live in-flight count and the override of each key given, changing nothing.
-- KEYS: for each key, its leases, permits and limit (three names, as every script takes them).
-- ARGV[1] clock offset ms.
-- Returns {in_flight, override (0: none)} for each key, in order. Expired leases (deadline <= now) do not
-- count and are left for the next admission to reclaim. One script so that the count and its weights
-- are read at one moment, on the Redis clock.
clock_ms, now, now_us = clock(ARGV[1])
local upto = '(' .. string.format('%d', now)
local out = {}
for i = 1, #KEYS, 3 do
  local key = {leases = KEYS[i], permits = KEYS[i + 1], limit = KEYS[i + 2]}
  local n = redis.call('ZCOUNT', key.leases, upto, '+inf')
  if n > 0 and redis.call('EXISTS', key.permits) == 1 then
    key.hashed, n = true, 0
    for _, id in ipairs(redis.call('ZRANGEBYSCORE', key.leases, upto, '+inf')) do
      n = n + meta(key, id)
    end
  end
  out[#out + 1] = n
  out[#out + 1] = n > 0 and override(key) or 0
end
return out
