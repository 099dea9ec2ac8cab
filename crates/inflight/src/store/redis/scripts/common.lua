-- common.lua: prepended to every inflight script, so the rules below exist once.
--
-- Data model of one user key K (E = K escaped, so that every key name shares the hash tag {E} and
-- lives in one Cluster slot):
--   <prefix>{E}:leases   sorted set: member = permit id, score = lease deadline (ms, Redis clock).
--                        A generated (UUID) id is the byte 0xFF and its 16 bytes; a given id is its text.
--   <prefix>{E}:weights  hash: permit id -> weight, only for weights > 1; field '' -> the sum of
--                        (weight - 1) over them, so in_flight = ZCARD(leases) + weights[''].
--   <prefix>{E}:limit    string: the key's limit override (absent: none). Configuration: no TTL.
-- Leases and weights expire together (PEXPIRE) a while after their latest deadline, so idle keys leave
-- nothing behind.

-- Now on the Redis clock, in ms; offset_ms is 0 outside tests (which move time instead of sleeping).
local function now_ms(offset_ms)
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + offset_ms
end

-- The effective limit and the override: the override when > 0, else the default; capped by the
-- ceiling when that is > 0; 0 means unlimited.
local function resolve_limit(override, default_limit, max_limit)
  local own = default_limit
  if override > 0 then own = override end
  if own == 0 then return max_limit end
  if max_limit == 0 or own < max_limit then return own end
  return max_limit
end

local function effective_limit(limit_key, default_limit, max_limit)
  local override = tonumber(redis.call('GET', limit_key) or '0') or 0
  return resolve_limit(override, default_limit, max_limit), override
end

local function weight_of(weights_key, id)
  return tonumber(redis.call('HGET', weights_key, id) or '1')
end

local function forget_weight(weights_key, id)
  local w = redis.call('HGET', weights_key, id)
  if w then
    redis.call('HDEL', weights_key, id)
    redis.call('HINCRBY', weights_key, '', 1 - tonumber(w))
  end
end

local function set_weight(weights_key, id, weight)
  forget_weight(weights_key, id)
  if weight > 1 then
    redis.call('HSET', weights_key, id, weight)
    redis.call('HINCRBY', weights_key, '', weight - 1)
  end
end

local function in_flight(leases_key, weights_key)
  local n = redis.call('ZCARD', leases_key)
  if n == 0 then
    -- No lease, so no weight: drop weights left over (say, a leases key evicted alone).
    redis.call('DEL', weights_key)
    return 0
  end
  return n + tonumber(redis.call('HGET', weights_key, '') or '0')
end

-- Removes the leases whose deadline has passed (deadline <= now); returns how many.
local function reclaim(leases_key, weights_key, now)
  local expired = redis.call('ZRANGEBYSCORE', leases_key, '-inf', now)
  if #expired == 0 then return 0 end
  if redis.call('EXISTS', weights_key) == 1 then
    for _, id in ipairs(expired) do forget_weight(weights_key, id) end
  end
  redis.call('ZREMRANGEBYSCORE', leases_key, '-inf', now)
  return #expired
end

-- Keeps a key's leases until well after `ms` from now: past the latest deadline, so that expired leases
-- are reclaimed (and counted, a sign of crashed holders) by whoever touches the key next, and an untouched
-- key still goes away by itself. The weights always expire with the leases, never after them.
-- (One PTTL per call; the PEXPIREs only when the leases would otherwise end within a second of `ms`.)
local function keep_for(leases_key, weights_key, ms)
  if redis.call('PTTL', leases_key) < ms + 1000 then
    local ttl = ms * 2 + 1000
    redis.call('PEXPIRE', leases_key, ttl)
    redis.call('PEXPIRE', weights_key, ttl)
  end
end

-- Sets the weight of a lease that was held with `held` (0: new); touches the weights hash only when a
-- weight other than 1 is involved, and gives it the leases' expiry.
local function reweigh(leases_key, weights_key, id, held, weight)
  if held > 1 or weight > 1 then
    set_weight(weights_key, id, weight)
    local ttl = redis.call('PTTL', leases_key)
    if ttl > 0 then redis.call('PEXPIRE', weights_key, ttl) end
  end
end

local function add_lease(leases_key, weights_key, id, weight, expires, lease_ms)
  redis.call('ZADD', leases_key, expires, id)
  reweigh(leases_key, weights_key, id, 0, weight)
  keep_for(leases_key, weights_key, lease_ms)
end

