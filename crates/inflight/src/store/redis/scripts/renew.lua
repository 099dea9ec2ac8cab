-- renew.lua: extends a lease, or re-adds one the store lost when asked to and there is room.
-- KEYS[1] leases, KEYS[2] weights, KEYS[3] limit
-- ARGV[1] permit id, ARGV[2] lease ms, ARGV[3] default limit, ARGV[4] max limit,
-- ARGV[5] weight to re-add with (0: do not re-add), ARGV[6] clock offset ms
-- Returns {outcome, limit, in_flight, weight, expires_at_ms}: outcome 1 renewed, 2 re-added, 0 lost.
-- Atomic because "is it still there?" and "extend it" (or "is there room?" and "add it") must be one
-- step, or an expired lease could be extended after another holder took its slot.
local id, lease_ms, readd = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[5])
local limit = effective_limit(KEYS[3], tonumber(ARGV[3]), tonumber(ARGV[4]))
local now = now_ms(tonumber(ARGV[6]))
local expires = now + lease_ms
-- Expired leases go first (this one included, if it has expired), so that the count is of live ones.
reclaim(KEYS[1], KEYS[2], now)
if redis.call('ZSCORE', KEYS[1], id) then
  redis.call('ZADD', KEYS[1], expires, id)
  keep_for(KEYS[1], KEYS[2], lease_ms)
  return {1, limit, in_flight(KEYS[1], KEYS[2]), weight_of(KEYS[2], id), expires}
end
if readd == 0 then return {0, limit, 0, 0, 0} end
local count = in_flight(KEYS[1], KEYS[2])
-- Nothing is recorded for an unlimited key: nothing was lost.
if limit == 0 then return {1, 0, count, readd, expires} end
if count + readd > limit then return {0, limit, count, 0, 0} end
add_lease(KEYS[1], KEYS[2], id, readd, expires, lease_ms)
return {2, limit, count + readd, readd, expires}
