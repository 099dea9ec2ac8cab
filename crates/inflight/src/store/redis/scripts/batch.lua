-- batch.lua: the admissions and releases waiting to be sent, in one call.
-- KEYS: leases, permits, limit of each user key of the batch, once each (see common.lua).
-- ARGV[1] clock offset ms; then the operations in order, each 'a' (admission) or 'r' (release), n, the
-- places of its n keys among the KEYS (1 for the first three, ...), the permit id, and for an admission
-- its terms 'weight lease_ms default_limit max_limit'.
-- Returns the replies in one flat array: 6 numbers an admission, 1 a release.
-- Each operation is one atomic decision, as it must be (reading the override, counting and adding in
-- separate round trips lets N workers go N - 1 over the limit); batching only spares Redis a script
-- call per operation.

-- An admission on every key or on none: decision (1 admitted, 0 full, 2 unlimited: nothing recorded,
-- 3 weight over the limit), the refusing key's index (0-based; -1), limit and in_flight (of that key,
-- or of the first), expires_at_ms, reclaimed. Unlimited keys record nothing.
local function acquire(keys, id, weight, lease_ms, default_limit, max_limit)
  local reclaimed, limits, any = 0, {}, false
  for i, key in ipairs(keys) do
    reclaimed, key.reclaimed = reclaimed + key.reclaimed, 0 -- reported once
    limits[i] = resolve(override(key), default_limit, max_limit)
    local limit, n = limits[i], in_flight(key)
    if limit > 0 then
      any = true
      if weight > limit then return 3, i - 1, limit, 0, 0, reclaimed end
      -- No room for a new lease: a retry of a held id never needs more than it has.
      if n + weight > limit then
        local held = redis.call('ZSCORE', key.leases, id) and meta(key, id) or 0
        if weight > held and n - held + weight > limit then return 0, i - 1, limit, n, 0, reclaimed end
      end
    end
  end
  if not any then return 2, -1, 0, 0, 0, reclaimed end
  for i, key in ipairs(keys) do
    if limits[i] > 0 then put(key, id, weight, lease_ms) end
  end
  return 1, -1, limits[1], limits[1] > 0 and in_flight(keys[1]) or 0, now + lease_ms, reclaimed
end

-- A release from every key: 1 when any held a live lease, 0 when all were gone.
local function release(keys, id)
  local released = 0
  for _, key in ipairs(keys) do
    if redis.call('ZREM', key.leases, id) == 1 then
      released, key.n = 1, key.n - 1
      forget(key, id)
      key.kept = 0 -- an emptied set is deleted with its expiry: the next lease sets one again
    end
  end
  return released
end

set_now(tonumber(ARGV[1]))
local replies, a = {}, 2
while a <= #ARGV do
  local n, keys = tonumber(ARGV[a + 1]), {}
  for j = 1, n do
    local k = tonumber(ARGV[a + 1 + j]) * 3
    keys[j] = view(KEYS[k - 2], KEYS[k - 1], KEYS[k])
  end
  local id = ARGV[a + 2 + n]
  if ARGV[a] == 'a' then
    local w, l, d, m = string.match(ARGV[a + 3 + n], '^(%d+) (%d+) (%d+) (%d+)$')
    for _, v in ipairs({acquire(keys, id, tonumber(w), tonumber(l), tonumber(d), tonumber(m))}) do
      replies[#replies + 1] = v
    end
    a = a + 4 + n
  else
    replies[#replies + 1] = release(keys, id)
    a = a + 3 + n
  end
end
return replies
