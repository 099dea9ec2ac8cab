-- common.lua: prepended to every inflight script, so the rules below exist once.
--
-- Data model of one user key K (E = K escaped, so that every key name shares the hash tag {E} and
-- lives in one Cluster slot):
--   <prefix>{E}:leases   sorted set: member = permit id, score = lease deadline (ms, Redis clock).
--                        A generated (UUID) id is the byte 0xFF and its 16 bytes; a given id is its text.
--   <prefix>{E}:weights  hash: permit id -> weight, only for weights > 1; field '' -> the sum of
--                        (weight - 1) over them, so in_flight = the number of leases + weights[''].
--   <prefix>{E}:limit    string: the key's limit override (absent: none). Configuration: no TTL.
--
-- A key with more than SHARD_FROM leases is sharded. Redis keeps a sorted set of up to 128 members
-- (zset-max-listpack-entries) as one compact listpack, about 32 bytes a lease; a larger one becomes a
-- skiplist and a dict, about 120. So a sharded key's leases are spread over sorted sets that each stay
-- small, by linear hashing on the id (the set grows one shard at a time by splitting one in two):
--   <prefix>{E}:leases, <prefix>{E}:leases:1 ... <prefix>{E}:leases:<N-1>   the N shards
--   <prefix>{E}:leases:due   sorted set: shard number -> a deadline no later than the shard's earliest,
--                            so that reclaiming looks only at shards with something due
--   weights[BOOK] = 'N n L': N shards, n leases, and L a lease length no lease's deadline is beyond
--                            (counted from now), so that a lease at least that long is its shard's
--                            latest and leaves the due set as it is (a Redis clock stepped back by d
--                            can delay reclaiming such a lease by up to d). No permit id is spelled '\254':
--                            0xFE is never in UTF-8 text, and a generated id starts with 0xFF.
-- The shards' names are made here from the leases key's name: the same hash tag, the same slot (Redis
-- and Redis Cluster allow keys a script does not declare in the slot of those it does; servers that
-- insist on declared keys would refuse a crowded key).
-- When its last lease goes, a sharded key becomes a plain one again.
--
-- Leases and weights expire (PEXPIREAT) a while after their latest deadline, so idle keys leave nothing
-- behind.

local BOOK = '\254'
-- A plain key holding more leases than this is sharded: the largest plain set, 128 members, is still
-- a listpack (Redis's default zset-max-listpack-entries), and a key with up to 127 permits in flight
-- (a proxy's 64 connections, with releases still on their way) keeps the cheaper plain path.
local SHARD_FROM = 127
-- A sharded key splits a shard whenever it holds more than this many leases per shard. Linear hashing
-- leaves the shards not yet split at this round with up to twice the average: 32, plus chance (a
-- listpack of 16 takes an admission and a release in 1.4 us, one of 48 in 2.5).
local SPLIT_AT = 16

-- The Redis clock at the script's start, in ms, without the tests' offset: expiries are set as instants
-- from it (PEXPIREAT), so that two keys given one expiry get the same instant however long the script
-- runs, and an expiry copied from another key's PTTL is never later than that key's.
local clock_ms = 0

-- Now on the Redis clock, in ms; offset_ms is 0 outside tests (which move time instead of sleeping).
local function now_ms(offset_ms)
  local t = redis.call('TIME')
  clock_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  return clock_ms + offset_ms
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

-- An id's hash, 0 <= h < 2^32: h * 31 + byte over its bytes, kept exact in Lua's doubles (below 2^53)
-- by reducing it every few bytes. A generated id's 16 bytes are read in one call (time-based UUIDs
-- given as ids vary in some bytes only, so all of them count); any other id 32 bytes at a time.
local function id_hash(id)
  if #id == 17 and string.byte(id, 1) == 255 then
    local a, b, c, d, e, f, g, h, i, j, k, l, m, n, o, p = string.byte(id, 2, 17)
    local x = ((a * 31 + b) * 31 + c) * 31 + d
    x = ((((x * 31 + e) * 31 + f) * 31 + g) * 31 + h) % 4294967296
    x = ((((x * 31 + i) * 31 + j) * 31 + k) * 31 + l) % 4294967296
    return ((((x * 31 + m) * 31 + n) * 31 + o) * 31 + p) % 4294967296
  end
  local h = 0
  for from = 1, #id, 32 do
    local bytes = {string.byte(id, from, from + 31)}
    for i = 1, #bytes do h = (h * 31 + bytes[i]) % 4294967296 end
  end
  return h
end

-- The largest power of two no greater than n (n >= 1).
local function base_of(n)
  local base = 1
  while base * 2 <= n do base = base * 2 end
  return base
end

-- Everything a script learns about a user key, kept for the rest of the script (a script is one atomic
-- step: only its own operations change the key meanwhile), so that a hot key costs a batch a handful of
-- calls plus one per admission or release.
local seen = {}

local function shard_name(key, i)
  local name = key.names[i]
  if name == nil then
    name = key.leases .. ':' .. i
    key.names[i] = name
  end
  return name
end

-- The sorted set that holds (or would hold) id's lease, and its shard number.
local function lease_set(key, id)
  if key.shards <= 1 then return key.leases, 0 end
  local h = id_hash(id)
  local i = h % key.base
  if i < key.shards - key.base then i = h % (key.base * 2) end
  return shard_name(key, i), i
end

local function forget_weight(key, id)
  local w = redis.call('HGET', key.weights, id)
  if w then
    redis.call('HDEL', key.weights, id)
    redis.call('HINCRBY', key.weights, '', 1 - tonumber(w))
    key.extra = key.extra - (tonumber(w) - 1)
  end
end

local function held_weight(key, id)
  if key.extra == 0 then return 1 end
  return tonumber(redis.call('HGET', key.weights, id) or '1')
end

-- Gives a lease held with `held` (0: new) the weight `weight`; touches the weights hash only when a
-- weight other than 1 is involved. A plain key's weights get the leases' expiry (a sharded key's hash
-- holds its shard count and already lives as long as its leases).
local function reweigh(key, id, held, weight)
  if held <= 1 and weight <= 1 then return end
  forget_weight(key, id)
  if weight > 1 then
    redis.call('HSET', key.weights, id, weight)
    redis.call('HINCRBY', key.weights, '', weight - 1)
    key.extra = key.extra + weight - 1
  end
  if key.shards == 0 then
    local ttl = redis.call('PTTL', key.leases)
    if ttl > 0 then redis.call('PEXPIREAT', key.weights, clock_ms + ttl) end
  end
end

-- The number of leases, read when first needed (a sharded key keeps it in its weights hash).
local function leases(key)
  if key.n == nil then
    key.n = redis.call('ZCARD', key.leases)
    if key.n == 0 and key.extra ~= 0 then
      -- No lease, so no weight: drop weights left over (say, a leases key evicted alone).
      redis.call('DEL', key.weights)
      key.extra = 0
    end
  end
  return key.n
end

local function in_flight(key)
  return leases(key) + key.extra
end

-- Removes the expired leases (deadline <= now, the time as text) of one sorted set; returns how many.
local function reclaim_set(key, set, now)
  if key.extra == 0 then return redis.call('ZREMRANGEBYSCORE', set, '-inf', now) end
  local expired = redis.call('ZRANGEBYSCORE', set, '-inf', now)
  if #expired == 0 then return 0 end
  for _, id in ipairs(expired) do forget_weight(key, id) end
  redis.call('ZREMRANGEBYSCORE', set, '-inf', now)
  return #expired
end

-- When a sharded key's shards and due set expire: a second after its weights hash (which holds the count
-- of leases), so that they never go first; by then every lease in them is long past its deadline, and
-- a shard of an earlier life is emptied before it is used again.
local function sets_expiry(key)
  if key.expires_at == nil then key.expires_at = clock_ms + redis.call('PTTL', key.weights) end
  return key.expires_at + 1000
end

-- After an entry was added to the due set: a due set that lost its last entry earlier in the script was
-- deleted by Redis, with its expiry; the one the entry made takes the key's.
local function due_kept(key)
  if key.due_gone then
    redis.call('PEXPIREAT', key.due, sets_expiry(key))
    key.due_gone = false
  end
end

-- Sets shard i's entry in the due set to its earliest deadline, or removes it when the shard is empty.
local function refresh_due(key, i)
  local first = redis.call('ZRANGE', shard_name(key, i), 0, 0, 'WITHSCORES')
  if first[2] then
    redis.call('ZADD', key.due, first[2], i)
    key.due_at[i] = tonumber(first[2])
    due_kept(key)
  else
    redis.call('ZREM', key.due, i)
    key.due_at[i] = nil
    key.due_gone = true
  end
end

-- Removes the key's expired leases; returns how many.
local now_text = nil
local function reclaim(key, now)
  if now_text == nil then now_text = string.format('%.0f', now) end
  now = now_text
  if key.shards == 0 then return reclaim_set(key, key.leases, now) end
  local total = 0
  for _, i in ipairs(redis.call('ZRANGEBYSCORE', key.due, '-inf', now)) do
    i = tonumber(i)
    total = total + reclaim_set(key, shard_name(key, i), now)
    refresh_due(key, i)
  end
  key.n = key.n - total
  return total
end

-- Makes `key` a sharded key of `shards` shards in the script's view: its due set, its base (the largest
-- power of two not above its shard count), and per shard its name, whether it was checked for an
-- expiry and an upper bound of its due entry.
local function sharded(key, shards)
  key.shards, key.base, key.due = shards, base_of(shards), key.leases .. ':due'
  key.names, key.checked, key.due_at = {[0] = key.leases}, {}, {}
end

-- The script's view of a key: its expired leases reclaimed once, the rest read when first needed.
local function view(leases_key, weights_key, limit_key, now)
  local key = seen[leases_key]
  if key then return key end
  local meta = redis.call('HMGET', weights_key, '', BOOK)
  -- n: the number of leases, read when first needed; ttl_ms: the longest lease the key's expiry was
  -- kept for in this script; now: the script's time
  key = {
    leases = leases_key, weights = weights_key, limit = limit_key, extra = tonumber(meta[1]) or 0,
    shards = 0, n = nil, reclaimed = 0, override = nil, ttl_ms = 0, now = now,
  }
  if meta[2] then
    -- A sharded key's also: its longest lease, its weights' expiry (an instant) once known, and its
    -- bookkeeping as read (written back only when changed).
    local shards, n, longest = string.match(meta[2], '^(%d+) (%d+) (%d+)$')
    sharded(key, tonumber(shards))
    key.n, key.longest, key.read = tonumber(n), tonumber(longest), meta[2]
  end
  seen[leases_key] = key
  key.reclaimed = reclaim(key, now)
  return key
end

local function override(key)
  if key.override == nil then key.override = tonumber(redis.call('GET', key.limit) or '0') or 0 end
  return key.override
end

-- Keeps a plain key's leases (and weights) until well after `ms` from now: past the latest deadline,
-- so that expired leases are reclaimed (and counted, a sign of crashed holders) by whoever touches the
-- key next, and an untouched key still goes away by itself. A set that was empty before this lease is
-- one Redis has just made, with no expiry; any other costs one PTTL, and the PEXPIREs only when it
-- would end within a second of `ms`. The weights hash exists only while some lease weighs more than 1
-- (or just after): otherwise it is left as it is.
local function keep_plain(key, ms)
  if key.n ~= 0 and redis.call('PTTL', key.leases) >= ms + 1000 then return end
  local at = clock_ms + ms * 2 + 1000
  redis.call('PEXPIREAT', key.leases, at)
  if key.extra > 0 then redis.call('PEXPIREAT', key.weights, at) end
end

-- After a lease in shard i got the deadline `expires` (lease_ms from now): the sets that hold it outlive
-- it, and the due set knows it. A key's expiry is looked at once per script and lease length.
--
-- A plain key's weights expire with its leases, never after them. A sharded key's due set and shards
-- expire a second after its weights (sets_expiry): a shard gone before the count of its leases would
-- leave the count too high for good. So the weights' expiry is kept as a plain key's leases' is, and
-- the others' moved with it (one PEXPIREAT a shard, once in about a lease length); a shard made since
-- takes it too.
local function keep(key, i, expires, lease_ms)
  if key.shards == 0 then
    if lease_ms > key.ttl_ms then
      keep_plain(key, lease_ms)
      key.ttl_ms = lease_ms
    end
    return
  end
  if lease_ms > key.ttl_ms then
    local ttl = redis.call('PTTL', key.weights)
    if ttl < lease_ms + 1000 then
      key.expires_at = clock_ms + lease_ms * 2 + 1000
      redis.call('PEXPIREAT', key.weights, key.expires_at)
      local at = sets_expiry(key)
      redis.call('PEXPIREAT', key.due, at)
      for s = 0, key.shards - 1 do redis.call('PEXPIREAT', shard_name(key, s), at) end
    end
    key.ttl_ms = lease_ms
  end
  -- A shard without an expiry was made by this lease: it takes the key's, and the due set needs its
  -- entry. Otherwise the due set holds one no later than the shard's earliest deadline, which a lease
  -- at least as long as any other leaves as it is.
  local fresh = false
  if not key.checked[i] then
    local name = shard_name(key, i)
    if redis.call('PTTL', name) == -1 then
      redis.call('PEXPIREAT', name, sets_expiry(key))
      fresh = true
    end
    key.checked[i] = true
  end
  local due_at = key.due_at[i]
  if (fresh or lease_ms < key.longest) and (due_at == nil or expires < due_at) then
    redis.call('ZADD', key.due, 'LT', expires, i)
    key.due_at[i] = expires
    due_kept(key)
  end
  if lease_ms > key.longest then key.longest = lease_ms end
end

-- Splits the next shard in two (linear hashing): the ids of shard s = N - base whose hash says
-- s + base move to the new shard s + base.
local function split(key)
  local base = key.base
  local s = key.shards - base
  local from, to = shard_name(key, s), shard_name(key, s + base)
  redis.call('DEL', to) -- a shard of an earlier life of the key may linger until it expires
  local all = redis.call('ZRANGE', from, 0, -1, 'WITHSCORES')
  local moved, ids = {}, {}
  -- Moves what is gathered; in chunks, as Lua unpacks a few thousand values at most (a shard is larger
  -- than usual only when many ids share a hash).
  local function move()
    redis.call('ZADD', to, unpack(moved))
    redis.call('ZREM', from, unpack(ids))
    moved, ids = {}, {}
  end
  for j = 1, #all, 2 do
    if id_hash(all[j]) % (base * 2) ~= s then
      moved[#moved + 1] = all[j + 1]
      moved[#moved + 1] = all[j]
      ids[#ids + 1] = all[j]
      if #ids == 1000 then move() end
    end
  end
  if #ids > 0 then move() end
  redis.call('PEXPIREAT', to, sets_expiry(key))
  key.shards = key.shards + 1
  if key.shards == base * 2 then key.base = base * 2 end
  -- Either set may have been emptied (and deleted by Redis) or made: each is checked again when next used.
  key.checked[s], key.checked[s + base] = nil, nil
  refresh_due(key, s)
  refresh_due(key, s + base)
end

-- A plain key becomes a sharded key of one shard (its leases set), then splits as its count says.
local function shard(key)
  sharded(key, 1)
  redis.call('DEL', key.due)
  key.checked[0] = true
  refresh_due(key, 0)
  local last = redis.call('ZRANGE', key.leases, -1, -1, 'WITHSCORES')
  key.longest = math.max(tonumber(last[2]) - key.now, 0)
  -- The leases' expiry becomes the key's (they were kept for the longest lease of this script); the
  -- bookkeeping is written now so that the hash exists to take it (finish writes it again if it moves).
  key.expires_at = clock_ms + redis.call('PTTL', key.leases)
  key.read = string.format('1 %d %d', key.n, key.longest)
  redis.call('HSET', key.weights, BOOK, key.read)
  redis.call('PEXPIREAT', key.weights, key.expires_at)
  redis.call('PEXPIREAT', key.due, sets_expiry(key))
end

-- Counts a new lease (its shard's expiry and due entry already kept; the count known); a plain key
-- past SHARD_FROM is sharded, a sharded one splits as its count says.
local function added(key)
  key.n = key.n + 1
  if key.shards == 0 then
    if key.n <= SHARD_FROM then return end
    shard(key)
  end
  while key.n > SPLIT_AT * key.shards do split(key) end
end

-- Writes what the script changed of each sharded key's bookkeeping; a key whose last lease went
-- becomes a plain key again (its shards have gone with their last members).
local function finish()
  for _, key in pairs(seen) do
    if key.shards > 0 then
      if key.n == 0 then
        redis.call('DEL', key.weights, key.due)
      else
        local book = string.format('%d %d %d', key.shards, key.n, key.longest)
        if book ~= key.read then redis.call('HSET', key.weights, BOOK, book) end
      end
    end
  end
end

