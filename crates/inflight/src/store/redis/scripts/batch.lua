-- batch.lua: the admissions and releases waiting to be sent, in one call.
-- KEYS: leases, permits, limit of each user key of the batch, once each (see common.lua).
-- ARGV[1] clock offset ms; then the operations in order: 'a' (an admission on one key), 'w' (a waiter's,
-- 'f' one with floors: see below), 'l' (a waiter gives up its ticket), 'g' (one under
-- an id generated for it: no earlier admission used the id), 'r' (a release from one key) or 'u' (an
-- undo: a refused admission across Cluster slots gives back what it took on one), or 'A', 'G', 'R' or
-- 'U' and n (on n keys); the places of its keys among the KEYS (1 for the
-- first three, ...); the permit id; then for an admission its terms 'weight lease_ms d1 m1 d2 m2 ...'
-- (the default and max limits of each key's class, in the operation's order) and the token its lease
-- keeps (0: the one it gets; across Cluster slots, the first slot's), for a release the token
-- of the admission released (0: whichever the id holds), for an undo the token the admission got and
-- what the id held before it, 'weight lease_ms token' ('0 0 0': nothing).
-- Returns the replies in one flat array: 12 numbers an admission, 1 a release, an undo or a leave.
-- Each operation is one atomic decision, as it must be (reading the override, counting and adding in
-- separate round trips lets N workers go N - 1 over the limit); batching only spares Redis a script
-- call per operation.

-- An admission on every key or on none: decision (1 admitted, 0 full, 2 unlimited: nothing recorded,
-- 3 weight over the limit, 4 full and the ticket queues, 5 full and the queue at its bound), the refusing key's index (0-based; -1), limit and in_flight (of that key,
-- or of the first), expires_at_ms, reclaimed, token, what the id held before on the first limited key
-- (weight, 0 when nothing; lease_ms; token), which keys recorded the lease (bit i - 1: key i), and how
-- many tickets of its keys' queues it found expired (their waiters' processes stopped renewing them).
-- Unlimited keys record nothing.
local limits, limited = {}, {} -- of the operation's keys, by place: reused, each operation writing its own
local replies, r = {}, 0 -- every operation's numbers, in order; r: how many so far
local function reply(...) -- an admission's 12 (the last: tickets found expired, see below)
  local out = {...}
  for j = 1, 11 do replies[r + j] = out[j] end
  replies[r + 12] = tickets_expired
  r = r + 12
end

-- A refusal by key i; a waiter (w) takes or keeps its ticket there (decision 4), unless the queue is
-- at its bound (5), and leaves the queue of any other key of the admission.
local function refuse(keys, n, i, limit, count, reclaimed, w)
  local decision = 0
  if w and w.ticket then
    for j = 1, n do
      if j ~= i then queue().leave(keys[j], w.ticket, 1, false) end
    end
    decision = queue().take_ticket(keys[i], w, limit) == 1 and 4 or 5
  end
  return reply(decision, i - 1, limit, count, 0, reclaimed, 0, 0, 0, 0, 0)
end

local function acquire(keys, n, id, t, keep, generated, w, floors)
  local reclaimed, any, weight, lease_ms = 0, false, t[1], t[2]
  tickets_expired = 0
  local ticket, level = w and w.ticket, w and w.level or 0
  for i = 1, n do
    local key = load(keys[i])
    reclaimed, key.reclaimed = reclaimed + key.reclaimed, 0 -- reported once
    local limit, count = resolve(override(key), t[2 * i + 1], t[2 * i + 2]), key.n + key.extra
    limits[i] = limit
    if limit > 0 then
      any = true
      if weight > limit then return reply(3, i - 1, limit, 0, 0, reclaimed, 0, 0, 0, 0, 0) end
      -- No room for a new lease, or none behind the tickets ahead (queue.lua); a retry of a held id
      -- never needs more than it has.
      local reserve = floors and floors[i] and queue().reserved(key, level, floors[i]) or 0
      local over = count + weight + reserve > limit
      local behind = not over and key.queued and not queue().in_turn(key, limit - count, weight, ticket)
      if over or behind then
        local held = redis.call('ZSCORE', key.leases, id) and meta(key, id) or 0
        if weight > held and (behind or count - held + weight + reserve > limit) then
          return refuse(keys, n, i, limit, count, reclaimed, w)
        end
      end
    end
  end
  if not any then return reply(2, -1, 0, 0, 0, reclaimed, 0, 0, 0, 0, 0) end
  local m, counted = 0, 0
  for i = 1, n do
    if limits[i] > 0 then m, counted = m + 1, counted + 2 ^ (i - 1); limited[m] = keys[i] end
  end
  local token = next_token(limited, m)
  if keep ~= 0 then token = keep end
  local plain = generated and weight == 1 and lease_ms == DEFAULT_LEASE_MS
  local held, old_ms, old_token = put(limited[1], id, weight, lease_ms, token, plain)
  for i = 2, m do put(limited[i], id, weight, lease_ms, token, plain) end
  local first = keys[1]
  replies[r + 1], replies[r + 2], replies[r + 3] = 1, -1, limits[1]
  replies[r + 4], replies[r + 5], replies[r + 6] = limits[1] > 0 and first.n + first.extra or 0, now + lease_ms, reclaimed
  replies[r + 7], replies[r + 8], replies[r + 9], replies[r + 10], replies[r + 11] = token, held, old_ms, old_token, counted
  replies[r + 12] = tickets_expired
  r = r + 12
  for i = 1, n do
    if floors and floors[i] and limits[i] > 0 then queue().hold_at(keys[i], level, floors[i], id, weight) end
  end
  if ticket then -- admitted: the ticket leaves, and the next in line hear their turn if there is room
    for i = 1, n do
      if keys[i].queued then queue().leave(keys[i], ticket, limits[i] - in_flight(keys[i]), true) end
    end
  end
end

-- A release from every key: 1 when any held a live lease, 0 when all were gone. On a key with a queue,
-- the tickets at its head that now fit hear their turn (queue.lua). A lease a later admission of the id
-- took (another token) stays.
local function release(keys, n, id, token)
  local released = 0
  for i = 1, n do
    local key = keys[i]
    reclaim(key) -- (an expired lease is not released: it was lost)
    local weight, _, own, found = meta(key, id, not key.queue_read)
    if (token == 0 or own == 0 or own == token) and redis.call('ZREM', key.leases, id) == 1 then
      released, key.n = 1, key.n - 1 -- (n: read again when the key is loaded)
      if found then
        add_extra(key, 1 - weight)
        redis.call('HDEL', key.permits, id)
      end
      if key.n == 0 then key.kept = 0 end -- an emptied set goes with its expiry: the next lease sets one
      if key.queued then queue().call_after_release(key, in_flight(load(key)), weight) end
    end
  end
  return released
end

-- Undoes, on every key, an admission that got `token`: its lease removed when the id held nothing
-- before ('0 0 0'), else what it held put back ('weight lease_ms token'); a later admission's lease
-- stays. 1 when anything changed.
local function undo(keys, n, id, token, before)
  local weight, lease_ms, old_token = string.match(before, '^(%d+) (%d+) (%d+)$')
  weight, lease_ms, old_token = tonumber(weight), tonumber(lease_ms), tonumber(old_token)
  if weight == 0 then return release(keys, n, id, token) end
  local changed = 0
  for i = 1, n do
    load(keys[i])
    local _, _, own = meta(keys[i], id)
    if own == token and redis.call('ZSCORE', keys[i].leases, id) then
      put(keys[i], id, weight, lease_ms, old_token)
      changed = 1
    end
  end
  return changed
end

set_now(ARGV[1])
local a, terms, keys = 2, {}, {}
while a <= #ARGV do
  local kind, n = ARGV[a], 1
  if kind == 'A' or kind == 'G' or kind == 'W' or kind == 'F' or kind == 'R' or kind == 'U' or kind == 'L' then
    a, n = a + 1, tonumber(ARGV[a + 1])
  end
  for j = 1, n do
    local place = ARGV[a + j]
    local k = (place == '1' and 1 or tonumber(place)) * 3
    keys[j] = glance(KEYS[k - 2], KEYS[k - 1], KEYS[k])
  end
  local id = ARGV[a + n + 1]
  if kind == 'a' or kind == 'A' or kind == 'g' or kind == 'G' then
    local t = terms[ARGV[a + n + 2]] -- the operations of a batch mostly share their terms: read once
    if not t then
      t = {}
      for x in string.gmatch(ARGV[a + n + 2], '%d+') do t[#t + 1] = tonumber(x) end
      terms[ARGV[a + n + 2]] = t
    end
    local keep = ARGV[a + n + 3]
    acquire(keys, n, id, t, keep == '0' and 0 or tonumber(keep), kind == 'g' or kind == 'G')
    a = a + n + 4
  elseif kind == 'w' or kind == 'W' or kind == 'f' or kind == 'F' then
    -- A waiter's: then its ticket ('' none), level ('level:flow_weight' for a flow weight over 1), flow,
    -- ticket lease, generated; and for 'f' the
    -- floors of each key's class ('level:slots ...', one group per key, ';' between).
    local t = {}
    for x in string.gmatch(ARGV[a + n + 2], '%d+') do t[#t + 1] = tonumber(x) end
    local keep, b = ARGV[a + n + 3], a + n + 3
    local level, flow_weight = string.match(ARGV[b + 2], '^(%d+):?(%d*)$')
    local w = {ticket = ARGV[b + 1] ~= '' and ARGV[b + 1] or nil, level = tonumber(level), flow = ARGV[b + 3],
      ms = tonumber(ARGV[b + 4]), weight = t[1], flow_weight = flow_weight ~= '' and tonumber(flow_weight) or 1}
    local floors = nil
    if kind == 'f' or kind == 'F' then
      floors = {}
      for group in string.gmatch(ARGV[b + 6] .. ';', '([^;]*);') do
        local class = {}
        for lv, slots in string.gmatch(group, '(%d+):(%d+)') do class[#class + 1] = {tonumber(lv), tonumber(slots)} end
        floors[#floors + 1] = class
      end
    end
    acquire(keys, n, id, t, keep == '0' and 0 or tonumber(keep), ARGV[b + 5] == '1', w, floors)
    a = b + (floors and 7 or 6)
  elseif kind == 'l' or kind == 'L' then -- a waiter gives up its ticket (the "id" is the ticket)
    local left = 0
    for j = 1, n do -- (a ticket whose lease ended is no longer there: dropped first, as any call drops it)
      queue().expire_tickets(keys[j])
      if queue().leave(keys[j], id, 1, false) then left = 1 end
    end
    replies[r + 1] = left
    r, a = r + 1, a + n + 2
  elseif kind == 'r' or kind == 'R' then
    local token = ARGV[a + n + 2]
    replies[r + 1] = release(keys, n, id, token == '0' and 0 or tonumber(token))
    r, a = r + 1, a + n + 3
  else
    replies[r + 1] = undo(keys, n, id, tonumber(ARGV[a + n + 2]), ARGV[a + n + 3])
    r, a = r + 1, a + n + 4
  end
end
settle()
return replies
