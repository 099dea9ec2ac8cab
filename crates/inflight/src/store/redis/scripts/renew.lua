-- renew.lua: extends a permit's lease on each of its keys that holds it (and adds it where it fits on a
-- key that has become limited since); a lease held on no limited key is re-added when asked to and every
-- limited key has room, and is otherwise lost.
-- KEYS: leases, permits, limit of each of the permit's keys (see common.lua)
-- ARGV[1] permit id, ARGV[2] lease ms (0: the length it was acquired with), ARGV[3] weight to re-add
-- with (0: do not re-add), ARGV[4] clock offset ms, ARGV[5] the token of the admission renewed (0: any),
-- ARGV[5 + i] 'default max' of key i's class, then (optional) which keys recorded the lease at admission
-- (bit i - 1: key i; 0 or none: not known)
-- Returns {outcome (1 renewed, 2 re-added, 0 lost), limit, in_flight, weight, expires_at_ms, held,
-- token}, the figures of the first key, held 1 when a key of the call held the lease (on Redis Cluster a
-- permit's keys of different slots are renewed by a call each, and renewed as one where any held it),
-- and the lease's token. A lease that a later admission of the id took (another token) is not this
-- admission's: lost, and left as it is. Held on some keys but gone from one that recorded it at admission
-- (it lapsed there alone: its slot of a Cluster was out of reach) and without room there: lost too.
-- An unlimited key records nothing, so it has nothing to lose.
-- Atomic because "is it still there?" and "extend it" (or "is there room?" and "add it") must be one
-- step, or an expired lease could be extended after another holder took its slot.
clock_ms, now, now_us = clock(ARGV[4])
local id, lease_ms, readd, token = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[5])
local keys, limits, has, missing, weight, own, kept = {}, {}, {}, false, nil, nil, nil
local unrecorded = {} -- keys holding the lease without an entry: a plain lease, its admission time noted
local counted = tonumber(ARGV[6 + #KEYS / 3] or '0')
for i = 1, #KEYS / 3 do
  keys[i] = view(KEYS[i * 3 - 2], KEYS[i * 3 - 1], KEYS[i * 3])
  local default_limit, max_limit = string.match(ARGV[5 + i], '^(%d+) (%d+)$')
  limits[i] = resolve(override(keys[i]), tonumber(default_limit), tonumber(max_limit))
  local deadline = redis.call('ZSCORE', keys[i].leases, id)
  has[i] = deadline ~= false
  if has[i] then
    local w, ms, t, found = meta(keys[i], id)
    if not found then unrecorded[i] = tonumber(deadline) - DEFAULT_LEASE_MS end
    if token ~= 0 and t ~= 0 and t ~= token then return {0, 0, 0, 0, 0, 0, 0} end
    if not weight then weight, own, kept = w, ms, t end
  end
  missing = missing or (limits[i] > 0 and not has[i])
end
local held = weight and 1 or 0 -- before a re-add gives it a weight
if lease_ms == 0 then lease_ms = own or DEFAULT_LEASE_MS end
local outcome = 1
-- Revoked on a key (holders.lua): lost, and its lease goes from the others too (it is this admission's:
-- another token's answered lost above), their freed slots called as a release's are.
local revoked = false
for i, key in ipairs(keys) do
  if not has[i] and redis.call('HDEL', key.permits, REVOKED .. id) == 1 then revoked = true end
end
if revoked then
  for i, key in ipairs(keys) do
    if has[i] then
      local w = meta(key, id, true)
      forget(key, id)
      redis.call('ZREM', key.leases, id)
      key.n = key.n - 1
      if key.queued then queue().call_after_release(key, in_flight(key), w) end
    end
  end
  return {0, 0, 0, 0, 0, 0, 0}
end
-- Held on no key: gone, unless asked to re-add it and every limited key has room.
if missing and not weight then
  if readd == 0 then return {0, 0, 0, 0, 0, 0, 0} end
  for i, key in ipairs(keys) do
    if limits[i] > 0 and in_flight(key) + readd > limits[i] then return {0, 0, 0, 0, 0, 0, 0} end
  end
  outcome, weight = 2, readd
end
weight = weight or 1
for i, key in ipairs(keys) do
  local recorded = math.floor(counted / 2 ^ (i - 1)) % 2 == 1
  if recorded and not has[i] and limits[i] > 0 and outcome == 1 and in_flight(key) + weight > limits[i] then
    return {0, 0, 0, 0, 0, 0, 0}
  end
end
-- Held, but not on a key that has become limited since (a new rule, a new override): taken there too
-- where it fits, and left uncounted there otherwise: a held permit stays held.
token = (kept and kept ~= 0) and kept or token
for i, key in ipairs(keys) do
  if has[i] then
    put(key, id, meta(key, id), lease_ms, 0)
    if unrecorded[i] then -- an entry (put() wrote one for another length), its admission time beside it
      local since = string.format('%d', unrecorded[i]) .. ' '
      if lease_ms == DEFAULT_LEASE_MS then
        redis.call('HSET', key.permits, id, '1 ' .. DEFAULT_LEASE_MS, HOLDER .. id, since)
      else
        redis.call('HSET', key.permits, HOLDER .. id, since)
      end
      hashed(key)
      keep(key, lease_ms, false)
    end
  elseif limits[i] > 0 and (outcome == 2 or in_flight(key) + weight <= limits[i]) then
    put(key, id, weight, lease_ms, token)
  end
end
write_tokens()
return {outcome, limits[1], limits[1] > 0 and in_flight(keys[1]) or 0, weight, now + lease_ms, held, token}
