-- acquire.lua: one admission.
-- KEYS[1] leases, KEYS[2] weights, KEYS[3] limit (see common.lua)
-- ARGV[1] permit id, ARGV[2] weight (>= 1), ARGV[3] lease ms, ARGV[4] default limit, ARGV[5] max limit,
-- ARGV[6] clock offset ms
-- Returns {decision, limit, in_flight, expires_at_ms, reclaimed}:
--   decision 1 admitted, 0 full, 2 unlimited (nothing recorded), 3 weight over the limit.
-- Atomic because reading the override, counting and adding must be one step: done as separate round
-- trips, N workers that all read "limit - 1" all add, and the key goes N - 1 over its limit.
-- It is on every request's path, so it makes as few calls as it can: 7 when there is room.
local id, weight, lease_ms = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local limit = effective_limit(KEYS[3], tonumber(ARGV[4]), tonumber(ARGV[5]))
if limit == 0 then return {2, 0, 0, 0, 0} end
if weight > limit then return {3, limit, 0, 0, 0} end
local now = now_ms(tonumber(ARGV[6]))
local reclaimed = reclaim(KEYS[1], KEYS[2], now)
local count = in_flight(KEYS[1], KEYS[2])
local expires = now + lease_ms
if count + weight <= limit then
  -- Room even if the id is new: add (or refresh) it; ZADD says whether it was new.
  local held = 0
  if redis.call('ZADD', KEYS[1], expires, id) == 0 then held = weight_of(KEYS[2], id) end
  reweigh(KEYS[2], id, held, weight, lease_ms)
  keep_for(KEYS[1], lease_ms)
  return {1, limit, count - held + weight, expires, reclaimed}
end
-- No room for a new lease; a retried acquisition of a held id never needs more than it has.
local held = 0
if redis.call('ZSCORE', KEYS[1], id) then held = weight_of(KEYS[2], id) end
if weight > held and count - held + weight > limit then return {0, limit, count, 0, reclaimed} end
redis.call('ZADD', KEYS[1], expires, id)
reweigh(KEYS[2], id, held, weight, lease_ms)
keep_for(KEYS[1], lease_ms)
return {1, limit, count - held + weight, expires, reclaimed}
