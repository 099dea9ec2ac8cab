-- batch.lua: the admissions and releases waiting to be sent, in one call.
-- KEYS: 3 per user key of the batch, each user key once: leases, permits, limit (see common.lua).
-- ARGV[1] clock offset ms; then the operations in order:
--   an admission: 'a', n, the places of its n keys among the KEYS (1 for the first three, ...), permit
--                 id, its terms 'weight lease_ms default_limit max_limit' (one argument)
--   a release:    'r', n, the places of its n keys, permit id
-- Returns the replies one after another in one flat array: 6 numbers for an admission, 1 for a release.
-- Each operation is one atomic decision, as it must be (reading the override, counting and adding as
-- separate round trips lets N workers go N - 1 over the limit); running the waiting ones together only
-- spares Redis the cost of a script call per operation.

-- An admission on every key of `keys` or on none: decision, index (0-based) of the key that refused or
-- -1, limit, in_flight (of that key, or of the first), expires_at_ms, reclaimed. Decision: 1 admitted,
-- 0 full, 2 unlimited (nothing recorded), 3 weight over the limit. Only limited keys record the lease.
local function acquire(keys, id, weight, lease_ms, default_limit, max_limit)
  local reclaimed, limits, any = 0, {}, false
  for i, key in ipairs(keys) do
    reclaimed, key.reclaimed = reclaimed + key.reclaimed, 0 -- reported once
    local limit = resolve(override(key), default_limit, max_limit)
    limits[i] = limit
    if limit > 0 then
      any = true
      if weight > limit then return 3, i - 1, limit, 0, 0, reclaimed end
      local n = in_flight(key)
      if n + weight > limit then
        -- No room for a new lease; a retried acquisition of a held id never needs more than it has.
        local held = 0
        if redis.call('ZSCORE', key.leases, id) then held = meta(key, id) end
        if weight > held and n - held + weight > limit then return 0, i - 1, limit, n, 0, reclaimed end
      end
    end
  end
  if not any then return 2, -1, 0, 0, 0, reclaimed end
  for i, key in ipairs(keys) do
    if limits[i] > 0 then put(key, id, weight, lease_ms) end
  end
  local first = 0
  if limits[1] > 0 then first = in_flight(keys[1]) end
  return 1, -1, limits[1], first, now + lease_ms, reclaimed
end

-- A release from every key of `keys`: 1 when any held a live lease, 0 when all were already gone.
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
  local kind, n = ARGV[a], tonumber(ARGV[a + 1])
  local keys = {}
  for j = 1, n do
    local k = (tonumber(ARGV[a + 1 + j]) - 1) * 3
    keys[j] = view(KEYS[k + 1], KEYS[k + 2], KEYS[k + 3])
  end
  local id = ARGV[a + 2 + n]
  if kind == 'a' then
    local weight, lease_ms, default_limit, max_limit = string.match(ARGV[a + 3 + n], '^(%d+) (%d+) (%d+) (%d+)$')
    local r = {acquire(keys, id, tonumber(weight), tonumber(lease_ms), tonumber(default_limit), tonumber(max_limit))}
    for _, v in ipairs(r) do replies[#replies + 1] = v end
    a = a + 4 + n
  else
    replies[#replies + 1] = release(keys, id)
    a = a + 3 + n
  end
end
return replies
