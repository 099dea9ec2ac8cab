-- common.lua: follows base.lua in every script that works on user keys, so the rules below exist once.
-- Data model of one user key K (E = K escaped, so that its names share the hash tag {E}: one slot):
--   <prefix>{E}:leases   sorted set: permit id -> lease deadline (ms, Redis clock). A generated (UUID)
--                        id is the byte 0xFF and its 16 bytes; a given id is its text.
--   <prefix>{E}:permits  hash: permit id -> 'weight lease_ms token'; '' -> the sum of (weight - 1)
--                        over the leases (always there); '#' -> the key's last token. A fresh lease (the
--                        first admission of an id generated for it, weight 1, the default lease) has no
--                        entry: its id was never used before, so no other admission's release can name
--                        it, and any later admission of the id (a re-sent one) writes its entry.
--   permits QUEUED ('\254q': no permit id, which is UTF-8 text or starts with 0xFF, can be it): while
--                        the key may have a queue of tickets (queue.lua).
--   permits HOLDER .. id ('\254h' ..): 'admitted_ms label' of a lease with an entry that was given a
--                        label or renewed (holders.lua lists it); it goes with the entry.
--   permits REVOKED .. id: a revoked lease, so that its holder's renewal reports it lost (renew.lua).
-- Tokens (fencing): each admission gets one, larger than every token its keys gave before: the Redis
-- clock in microseconds, or the keys' last token + 1 when that is larger. A lease keeps its admission's
-- token; a later admission of the same id takes it over with its own, and a release or renewal naming
-- another token leaves it alone.
--   <prefix>{E}:limit    string: the key's limit override (absent: none). Configuration: no TTL.
-- in_flight = the number of leases + permits['']. Leases and permits expire together, a while after
-- the latest deadline, so that idle keys leave nothing behind.

-- A lease's weight, length and token (0: none kept); whether it has an entry. With `queue`, the same
-- read also tells whether the key may have a queue (key.queued: nil until read, once a call; see
-- queue.lua). Asked of a second id (key.looked: the last), it counts the hash's fields once: holding none
-- but '', '#' and QUEUED (key.looked = true), it has no entry until record() writes one, and the releases
-- of a busy key read nothing more. (One field for both: past 16, a key's table costs Redis a rehash.)
local function meta(key, id, queue)
  local m, looked = false, key.looked
  if looked == true and not queue then return 1, DEFAULT_LEASE_MS, 0, false end
  if key.hashed and queue then
    local fields = redis.call('HMGET', key.permits, id, QUEUED)
    m, key.queued = fields[1], fields[2] ~= false
  elseif key.hashed and looked and looked ~= id then
    local f = redis.call('HMGET', key.permits, id, '', '#', QUEUED)
    m = f[1]
    local bare = (f[2] and 1 or 0) + (f[3] and 1 or 0) + (f[4] and 1 or 0)
    looked = not m and redis.call('HLEN', key.permits) == bare
  elseif key.hashed then
    m = redis.call('HGET', key.permits, id)
  end
  key.looked = looked == nil and id or looked -- (checked once a call: true or false from then on)
  if not m then return 1, DEFAULT_LEASE_MS, 0, false end
  local weight, lease_ms, token = string.match(m, '^(%d+) (%d+) ?(%d*)$')
  return tonumber(weight), tonumber(lease_ms), tonumber(token) or 0, true
end

local function hashed(key) -- the hash is written: made anew, keep() gives it its expiry
  if not key.hashed then key.hashed, key.kept = true, 0 end
end

local function add_extra(key, delta)
  if delta == 0 then return end
  hashed(key)
  key.extra = redis.call('HINCRBY', key.permits, '', delta)
end

-- Records `id`'s lease as `weight` of `lease_ms` with `token`, where it was `held` (0: new) of `old_ms`,
-- and the key's last token.
local function record(key, id, held, old_ms, weight, lease_ms, token)
  if key.looked == true then key.looked = false end
  add_extra(key, (weight - 1) - math.max(held - 1, 0))
  if token ~= 0 then
    local entry = weight .. ' ' .. lease_ms .. ' ' .. string.format('%d', token)
    redis.call('HSET', key.permits, id, entry, '', key.extra)
    hashed(key)
  elseif weight ~= 1 or lease_ms ~= DEFAULT_LEASE_MS then
    if held ~= weight or old_ms ~= lease_ms then
      redis.call('HSET', key.permits, id, weight .. ' ' .. lease_ms, '', key.extra)
      hashed(key)
    end
  elseif held > 1 or old_ms ~= DEFAULT_LEASE_MS then
    redis.call('HDEL', key.permits, id)
  end
end

-- After `id`'s lease left the set: its entry, if it has one, goes.
local function forget(key, id)
  local weight, _, _, found = meta(key, id)
  if not found then return end
  add_extra(key, 1 - weight)
  redis.call('HDEL', key.permits, id, HOLDER .. id)
end

-- The script's keys, each made once: glance() names it and reads nothing; reclaim() removes its expired
-- leases (once); load() reads its number of leases n, its extra weight and last token (a hash left
-- without leases, its set evicted alone, counts no extra weight). Until loaded, a key is taken to have
-- its hash (meta() asks it) and its counts are not kept.
local seen = {}
local function glance(leases, permits, limit)
  local key = seen[leases]
  if key then return key end
  key = {leases = leases, permits = permits, limit = limit, kept = 0, hashed = true, extra = 0, last = 0,
    reclaimed = 0, n = 0, override = false, longest = 0, dirty = false, loaded = false, checked = false}
  seen[leases] = key
  return key
end

local function reclaim(key)
  if key.checked then return end
  key.checked = true
  -- Ranges over the expired only when the earliest deadline has passed (mostly none has).
  local first = redis.call('ZRANGE', key.leases, '0', '0', 'WITHSCORES') -- (text: see keep())
  if not (first[2] and tonumber(first[2]) <= now) then return end
  local upto = string.format('%d', now)
  if key.hashed then
    local expired = redis.call('ZRANGEBYSCORE', key.leases, '-inf', upto)
    for _, id in ipairs(expired) do forget(key, id) end
  end
  local removed = redis.call('ZREMRANGEBYSCORE', key.leases, '-inf', upto)
  key.reclaimed, key.n = key.reclaimed + removed, key.n - removed
end

local function load(key)
  if key.loaded then return key end
  key.loaded = true
  local fields = redis.call('HMGET', key.permits, '', '#', QUEUED)
  key.hashed, key.extra, key.last = fields[1] ~= false, num(fields[1]), num(fields[2])
  key.queued = fields[3] ~= false
  key.n = redis.call('ZCARD', key.leases)
  if key.n == 0 then key.checked = true else reclaim(key) end
  if key.n == 0 and key.extra ~= 0 then -- (the hash stays: it keeps the key's last token)
    redis.call('HSET', key.permits, '', 0)
    key.extra = 0
  end
  return key
end

local function view(leases, permits, limit) return load(glance(leases, permits, limit)) end

local function override(key)
  key.override = key.override or override_of(redis.call('GET', key.limit))
  return key.override
end

-- A change of override as the scripts take it ('0' clears), as written; nil when out of range.
local function override_arg(text)
  local n = string.match(text, '^%d+$') and tonumber(text)
  if not n or n > MAX_OVERRIDE then return nil end
  return string.format('%d', n)
end
local OVERRIDE_RANGE = 'ERR an override is a whole number from 0 (clear) to 4294967295' -- (MAX_OVERRIDE: a literal, since
-- a concatenation would format the number on every call of every script)

local function in_flight(key) return key.n + key.extra end

-- Keeps the key's leases and permits past `lease_ms` from now (past every deadline, so that whoever
-- touches the key next reclaims and counts expired leases, and an untouched key still goes away), both
-- to the same instant, so that the hash never outlives the set.
local function keep(key, lease_ms, fresh)
  if lease_ms <= key.kept then return end
  local ttl = fresh and -1 or redis.call('PTTL', key.leases) -- a set made just now has no expiry
  local renew = ttl < lease_ms + 1000
  if renew then ttl = lease_ms * 2 + 1000 end
  local at = string.format('%d', clock_ms + ttl) -- (text, once: Redis prints a number argument, dearer)
  if renew then redis.call('PEXPIREAT', key.leases, at) end
  if key.hashed then redis.call('PEXPIREAT', key.permits, at) end
  key.kept, key.longest = lease_ms, math.max(key.longest or 0, lease_ms)
end

-- The next token of an admission on `keys` (the first n): each key's last from now on (written once a
-- script, by write_tokens()).
local function next_token(keys, n)
  local token = now_us
  for i = 1, n do if keys[i].last >= token then token = keys[i].last + 1 end end -- (not math.max: a call)
  for i = 1, n do keys[i].last, keys[i].dirty = token, true end
  return token
end

-- At the script's end: each key's last token written where it moved (with the extra weight, so that the
-- hash keeps both fields), and a hash made just now given the expiry of the key's leases.
local function write_tokens()
  for _, key in pairs(seen) do
    if key.dirty then
      local made = not key.hashed
      local extra = key.extra == 0 and '0' or key.extra -- (text: see keep())
      redis.call('HSET', key.permits, '#', string.format('%d', key.last), '', extra)
      if made then
        hashed(key)
        keep(key, key.longest or DEFAULT_LEASE_MS, false)
      end
    end
  end
end

local deadlines = {} -- as ZADD takes them, by lease length: formatted once a script
-- Adds (or refreshes) `id`'s lease, keeping `token` (0: the one it has); an id `plain` (generated for
-- this admission, weight 1, the default lease) keeps no entry when new. Returns what it was before:
-- weight (0: not held), length and token.
local function put(key, id, weight, lease_ms, token, plain)
  local deadline = deadlines[lease_ms]
  if not deadline then deadline = string.format('%d', now + lease_ms); deadlines[lease_ms] = deadline end
  local held, old_ms, old_token, empty = 0, DEFAULT_LEASE_MS, 0, key.n == 0
  if redis.call('ZADD', key.leases, deadline, id) == 1 then
    key.n = key.n + 1
    if plain then token = 0 end
  else
    held, old_ms, old_token = meta(key, id)
  end
  if token == 0 then token = old_token end
  if held > 0 or weight ~= 1 or lease_ms ~= DEFAULT_LEASE_MS or token ~= 0 then
    record(key, id, held, old_ms, weight, lease_ms, token)
  end
  if lease_ms > key.kept then keep(key, lease_ms, empty) end
  return held, old_ms, old_token
end
