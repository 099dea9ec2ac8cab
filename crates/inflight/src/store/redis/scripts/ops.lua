-- ops.lua: an admission and a release, as functions the batch script calls once per operation.
--
-- Everything the operations of one batch learn about a key is kept for the rest of the batch (the batch
-- is one atomic step, so only its own operations change the key meanwhile): a hot key costs a handful of
-- calls per batch plus one ZADD per admission and one ZREM per release.

local seen = {}

-- The batch's view of a key: its expired leases reclaimed once, the rest read when first needed.
local function touch(leases, weights, now)
  local key = seen[leases]
  if not key then
    key = {leases = leases, weights = weights, reclaimed = reclaim(leases, weights, now), ttl_ms = 0}
    seen[leases] = key
  end
  return key
end

-- The sum of (weight - 1) over the key's weighted leases.
local function extra(key)
  if key.extra == nil then key.extra = tonumber(redis.call('HGET', key.weights, '') or '0') end
  return key.extra
end

local function count(key)
  if key.count == nil then
    local n = redis.call('ZCARD', key.leases)
    if n == 0 and extra(key) ~= 0 then
      -- No lease, so no weight: drop weights left over (say, a leases key evicted alone).
      redis.call('DEL', key.weights)
      key.extra = 0
    end
    key.count = n + extra(key)
  end
  return key.count
end

local function override(key, limit_key)
  if key.override == nil then key.override = tonumber(redis.call('GET', limit_key) or '0') or 0 end
  return key.override
end

local function held_weight(key, id)
  if extra(key) == 0 then return 1 end
  return weight_of(key.weights, id)
end

-- A deadline as ZADD takes it: formatted once per batch and lease length, not once per admission.
local deadlines = {}
local function deadline(now, lease_ms)
  local text = deadlines[lease_ms]
  if not text then
    text = string.format('%.0f', now + lease_ms) -- %d would wrap past 2^63
    deadlines[lease_ms] = text
  end
  return text
end

-- One admission: returns decision, limit, in_flight, expires_at_ms, reclaimed:
--   decision 1 admitted, 0 full, 2 unlimited (nothing recorded), 3 weight over the limit.
local function acquire(leases, weights, limit_key, id, weight, lease_ms, default_limit, max_limit, now)
  local key = touch(leases, weights, now)
  local limit = resolve_limit(override(key, limit_key), default_limit, max_limit)
  local reclaimed = key.reclaimed
  key.reclaimed = 0 -- reported once
  if limit == 0 then return 2, 0, 0, 0, reclaimed end
  if weight > limit then return 3, limit, 0, 0, reclaimed end
  local n = count(key)
  local expires = now + lease_ms
  local at = deadline(now, lease_ms)
  local held = 0
  if n + weight <= limit then
    -- Room even if the id is new: add (or refresh) it; ZADD says whether it was new.
    if redis.call('ZADD', leases, at, id) == 0 then held = held_weight(key, id) end
  else
    -- No room for a new lease; a retried acquisition of a held id never needs more than it has.
    if redis.call('ZSCORE', leases, id) then held = held_weight(key, id) end
    if weight > held and n - held + weight > limit then return 0, limit, n, 0, reclaimed end
    redis.call('ZADD', leases, at, id)
  end
  if held > 1 or weight > 1 then
    key.extra = extra(key) - math.max(held - 1, 0) + (weight - 1)
    reweigh(leases, weights, id, held, weight)
  end
  key.count = n - held + weight
  if lease_ms > key.ttl_ms then
    keep_for(leases, weights, lease_ms)
    key.ttl_ms = lease_ms
  end
  return 1, limit, key.count, expires, reclaimed
end

-- One release; releasing twice is not an error. Returns 1 when a live lease was released, 0 when it was
-- already gone (released, or expired: touching the key reclaimed it).
local function release(leases, weights, id, now)
  local key = touch(leases, weights, now)
  local weight = held_weight(key, id)
  if redis.call('ZREM', leases, id) == 0 then return 0 end
  if weight > 1 then
    forget_weight(weights, id)
    key.extra = extra(key) - (weight - 1)
  end
  if key.count ~= nil then key.count = key.count - weight end
  -- The last lease gone, Redis deletes the set, and its expiry with it: the next admission of the batch
  -- must set one again on the set it creates (one PTTL when the count is not known here).
  if key.count == nil or key.count == 0 then key.ttl_ms = 0 end
  return 1
end

