-- ops.lua: an admission and a release, as functions the batch script calls once per operation.

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
local function acquire(leases_key, weights_key, limit_key, id, weight, lease_ms, default_limit, max_limit, now)
  local key = view(leases_key, weights_key, limit_key, now)
  local limit = resolve_limit(override(key), default_limit, max_limit)
  local reclaimed = key.reclaimed
  key.reclaimed = 0 -- reported once
  if limit == 0 then return 2, 0, 0, 0, reclaimed end
  if weight > limit then return 3, limit, 0, 0, reclaimed end
  local n = (key.n or leases(key)) + key.extra
  local expires = now + lease_ms
  local set, shard = leases_key, 0
  if key.shards > 0 then set, shard = lease_set(key, id) end
  local held = 0
  if n + weight <= limit then
    -- Room even if the id is new: add (or refresh) it; ZADD says whether it was new.
    if redis.call('ZADD', set, deadline(now, lease_ms), id) == 0 then held = held_weight(key, id) end
  else
    -- No room for a new lease; a retried acquisition of a held id never needs more than it has.
    if redis.call('ZSCORE', set, id) then held = held_weight(key, id) end
    if weight > held and n - held + weight > limit then return 0, limit, n, 0, reclaimed end
    redis.call('ZADD', set, deadline(now, lease_ms), id)
  end
  if held > 1 or weight > 1 then reweigh(key, id, held, weight) end
  if key.shards > 0 or lease_ms > key.ttl_ms then keep(key, shard, expires, lease_ms) end
  if held == 0 then
    -- added(key), inline for a plain key that stays plain: the common case
    if key.shards == 0 and key.n < SHARD_FROM then key.n = key.n + 1 else added(key) end
  end
  return 1, limit, n - held + weight, expires, reclaimed
end

-- One release; releasing twice is not an error. Returns 1 when a live lease was released, 0 when it was
-- already gone (released, or expired: viewing the key reclaimed it).
local function release(leases_key, weights_key, limit_key, id, now)
  local key = view(leases_key, weights_key, limit_key, now)
  local set, shard = leases_key, 0
  if key.shards > 0 then set, shard = lease_set(key, id) end
  local weight = held_weight(key, id)
  if redis.call('ZREM', set, id) == 0 then return 0 end
  if weight > 1 then forget_weight(key, id) end
  if key.n ~= nil then key.n = key.n - 1 end
  -- Its last lease gone, Redis deletes a set, and its expiry with it: the next admission of the script
  -- must set one again on the set it creates (one PTTL when the count is not known here).
  if key.shards > 0 then
    key.checked[shard] = nil
  elseif key.n == nil or key.n == 0 then
    key.ttl_ms = 0
  end
  return 1
end
