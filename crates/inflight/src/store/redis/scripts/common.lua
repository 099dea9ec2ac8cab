-- common.lua: prepended to every inflight script, so the rules below exist once.
--
-- Data model of one user key K (E = K escaped, so that its names share the hash tag {E}: one slot):
--   <prefix>{E}:leases   sorted set: member = permit id, score = lease deadline (ms, Redis clock).
--                        A generated (UUID) id is the byte 0xFF and its 16 bytes; a given id is its text.
--   <prefix>{E}:permits  hash: permit id -> 'weight lease_ms', only for leases other than weight 1 of
--                        DEFAULT_LEASE_MS; field '' -> the sum of (weight - 1) over the leases, when > 0.
--   <prefix>{E}:limit    string: the key's limit override (absent: none). Configuration: no TTL.
-- in_flight = the number of leases + permits['']. Leases and permits expire together, a while after
-- their latest deadline, so that idle keys leave nothing behind.
local DEFAULT_LEASE_MS = 30000

-- The Redis clock at the script's start (clock_ms), and now: the same plus the tests' offset.
local clock_ms, now = 0, 0
local function set_now(offset_ms)
  local t = redis.call('TIME')
  clock_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  now = clock_ms + offset_ms
end

-- The effective limit: the override when > 0, else the default; capped by the ceiling when that is > 0;
-- 0 means unlimited.
local function resolve(override, default_limit, max_limit)
  local own = default_limit
  if override > 0 then own = override end
  if own == 0 then return max_limit end
  if max_limit == 0 or own < max_limit then return own end
  return max_limit
end

-- A lease's weight and length (a lease not in the hash is 1 of DEFAULT_LEASE_MS).
local function meta(key, id)
  local m = key.hashed and redis.call('HGET', key.permits, id)
  if not m then return 1, DEFAULT_LEASE_MS end
  local weight, lease_ms = string.match(m, '^(%d+) (%d+)$')
  return tonumber(weight), tonumber(lease_ms)
end

local function add_extra(key, delta)
  if delta == 0 then return end
  if not key.hashed then key.hashed, key.kept = true, 0 end -- a new hash: its expiry is set by keep()
  key.extra = redis.call('HINCRBY', key.permits, '', delta)
  if key.extra == 0 then redis.call('HDEL', key.permits, '') end
end

-- Records the weight and length of `id`'s lease, which had weight `held` (0: new) and length `old_ms`.
local function record(key, id, held, old_ms, weight, lease_ms)
  add_extra(key, (weight - 1) - math.max(held - 1, 0))
  local special = weight ~= 1 or lease_ms ~= DEFAULT_LEASE_MS
  local was = held > 0 and (held ~= 1 or old_ms ~= DEFAULT_LEASE_MS)
  if special and not (was and held == weight and old_ms == lease_ms) then
    if not key.hashed then key.hashed, key.kept = true, 0 end
    redis.call('HSET', key.permits, id, weight .. ' ' .. lease_ms)
  elseif was and not special then
    redis.call('HDEL', key.permits, id)
  end
end

-- After `id`'s lease left the set.
local function forget(key, id)
  if not key.hashed then return end
  add_extra(key, 1 - meta(key, id))
  redis.call('HDEL', key.permits, id)
end

-- The script's view of a key (once per script): expired leases reclaimed, the count of leases (n) and
-- the extra weight read. Hash left over without leases (its set evicted alone) is dropped.
local seen = {}
local function view(leases, permits, limit)
  local key = seen[leases]
  if key then return key end
  key = {leases = leases, permits = permits, limit = limit, kept = 0, reclaimed = 0}
  seen[leases] = key
  key.hashed = redis.call('EXISTS', permits) == 1
  key.extra = key.hashed and tonumber(redis.call('HGET', permits, '') or '0') or 0
  local upto = string.format('%.0f', now)
  if not key.hashed then
    key.reclaimed = redis.call('ZREMRANGEBYSCORE', leases, '-inf', upto)
  else
    local expired = redis.call('ZRANGEBYSCORE', leases, '-inf', upto)
    redis.call('ZREMRANGEBYSCORE', leases, '-inf', upto)
    for _, id in ipairs(expired) do forget(key, id) end
    key.reclaimed = #expired
  end
  key.n = redis.call('ZCARD', leases)
  if key.n == 0 and key.hashed then
    redis.call('DEL', permits)
    key.hashed, key.extra = false, 0
  end
  return key
end

local function override(key)
  if key.override == nil then key.override = tonumber(redis.call('GET', key.limit) or '0') or 0 end
  return key.override
end

local function in_flight(key) return key.n + key.extra end

-- Keeps the key's leases (and permits) until well after `lease_ms` from now: past every deadline, so
-- that expired leases are reclaimed (and counted) by whoever touches the key next, and an untouched
-- key still goes away by itself. Both get the same instant, so the hash never outlives the set.
local function keep(key, lease_ms)
  if lease_ms <= key.kept then return end
  local ttl = redis.call('PTTL', key.leases)
  if ttl < lease_ms + 1000 then
    ttl = lease_ms * 2 + 1000
    redis.call('PEXPIREAT', key.leases, clock_ms + ttl)
  end
  if key.hashed then redis.call('PEXPIREAT', key.permits, clock_ms + ttl) end
  key.kept = lease_ms
end

-- Adds (or refreshes) `id`'s lease of `weight` on a key.
local function put(key, id, weight, lease_ms)
  local held, old_ms = 0, DEFAULT_LEASE_MS
  if redis.call('ZADD', key.leases, string.format('%.0f', now + lease_ms), id) == 1 then
    key.n = key.n + 1
  else
    held, old_ms = meta(key, id)
  end
  record(key, id, held, old_ms, weight, lease_ms)
  keep(key, lease_ms)
end
