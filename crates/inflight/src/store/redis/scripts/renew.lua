-- renew.lua: extends a lease, or re-adds one the store lost when asked to and there is room.
-- KEYS[1] leases, KEYS[2] weights, KEYS[3] limit
-- ARGV[1] permit id, ARGV[2] lease ms, ARGV[3] default limit, ARGV[4] max limit,
-- ARGV[5] weight to re-add with (0: do not re-add), ARGV[6] clock offset ms
-- Returns {outcome, limit, in_flight, weight, expires_at_ms}: outcome 1 renewed, 2 re-added, 0 lost.
-- Atomic because "is it still there?" and "extend it" (or "is there room?" and "add it") must be one
-- step, or an expired lease could be extended after another holder took its slot.
local id, lease_ms, readd = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[5])
local now = now_ms(tonumber(ARGV[6]))
local expires = now + lease_ms
-- Expired leases go first (this one included, if it has expired), so that the count is of live ones.
local key = view(KEYS[1], KEYS[2], KEYS[3], now)
local limit = resolve_limit(override(key), tonumber(ARGV[3]), tonumber(ARGV[4]))
local set, shard = lease_set(key, id)
local function renew()
  if redis.call('ZSCORE', set, id) then
    redis.call('ZADD', set, expires, id)
    keep(key, shard, expires, lease_ms)
    return {1, limit, in_flight(key), held_weight(key, id), expires}
  end
  if readd == 0 then return {0, limit, 0, 0, 0} end
  local count = in_flight(key)
  -- Nothing is recorded for an unlimited key: nothing was lost.
  if limit == 0 then return {1, 0, count, readd, expires} end
  if count + readd > limit then return {0, limit, count, 0, 0} end
  redis.call('ZADD', set, expires, id)
  reweigh(key, id, 0, readd)
  keep(key, shard, expires, lease_ms)
  added(key)
  return {2, limit, count + readd, readd, expires}
end
local result = renew()
finish()
return result
