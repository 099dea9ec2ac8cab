-- batch.lua: the admissions, releases, undos and leaves waiting to be sent, in one call.
-- KEYS: leases, permits, limit of each user key of the batch, once each (see common.lua).
-- ARGV[1] clock offset ms; then one record per operation, in order: its head, the kind ('a' acquire,
-- 'r' release, 'u' undo, 'l' leave) and its flags (in hex) in one word, with 'x' and the number of its
-- keys when it has several ('a1': an acquire, flags 1, one key; 'r0x3': a release on three); its keys'
-- places among the KEYS (1 for the first three, ...); then its fields:
--   a  id; terms 'weight lease_ms keep d1 m1 d2 m2 ...': keep the token its lease keeps (0: the one it
--      gets; across Cluster slots, the first slot's), d and m the default and max limits of each key's
--      class, in the operation's order. Flags: 1 the id was generated for it (no earlier admission used
--      it); 2 its standing follows: ticket ('' none), 'level:flow_weight', flow, ticket lease ms; 4 (with
--      2) then the floors of each key's class ('level:slots ...', ';' between keys); 8 (with 2, one key,
--      no floors) a release may hand the waiter the slot (queue.lua's hand_off); 16 then the label of
--      its lease and ticket (holders.lua lists them); 32 then which keys' limits are watched, not
--      enforced (bit i - 1: key i): counted there, never refused nor queued (the answer's shadowed).
--   r  id; the token of the admission released (0: whichever the id holds).
--   u  id; the token the admission got; what the id held before it, 'weight lease_ms token' ('0 0 0':
--      nothing). A refused admission across Cluster slots gives back what it took on one.
--   l  the ticket a waiter gives up; flags 8: then the waiter's id, whose lease a release handed it is
--      released when the ticket is no longer in the queue (its waiter went before hearing of it).
-- Returns the answers in one flat array: an admission's (common.lua's answer), one number for the others.
-- Each operation is one atomic decision, as it must be (reading the override, counting and adding in
-- separate round trips lets N workers go N - 1 over the limit); batching only spares Redis a script
-- call per operation.

local limits, limited = {}, {} -- of the operation's keys, by place: reused, each operation writing its own
local replies, r = {}, 0 -- every operation's numbers, in order; r: how many so far

-- A refusal by key i; a waiter (w) takes or keeps its ticket there, unless the queue is at its bound,
-- and leaves the queue of any other key of the admission.
local function refuse(keys, n, i, limit, count, reclaimed, w)
  local decision = FULL
  if w and w.ticket then
    for j = 1, n do
      if j ~= i then queue().leave(keys[j], w.ticket, 1, false) end
    end
    decision = queue().take_ticket(keys[i], w, limit) == 1 and WAITS or WAITERS_BOUND
  end
  r = answer(replies, r, decision, i - 1, limit, count, 0, reclaimed, 0, 0, 0, 0, 0, count_expired())
end

-- An admission on every key or on none. Unlimited keys record nothing.
local function acquire(keys, n, id, t, generated, w, floors, label, shadow)
  local reclaimed, any, weight, lease_ms, keep, shadowed = 0, false, t[1], t[2], t[3], 0
  count_expired()
  local ticket, level = w and w.ticket, w and w.level or 0
  for i = 1, n do
    local key = load(keys[i])
    if key.reclaimed ~= 0 then reclaimed, key.reclaimed = reclaimed + key.reclaimed, 0 end -- reported once
    local limit, count = resolve(key.override or override(key), t[2 * i + 2], t[2 * i + 3]), key.n + key.extra
    limits[i] = limit
    if shadow and limit > 0 and shadow % 2 ^ i >= 2 ^ (i - 1) then -- watched: counted, never refused
      any = true
      if count + weight > limit then
        local held = redis.call('ZSCORE', key.leases, id) and meta(key, id) or 0
        if weight > held and count - held + weight > limit then shadowed = shadowed + 2 ^ (i - 1) end
      end
    elseif limit > 0 then
      any = true
      if weight > limit then
        r = answer(replies, r, TOO_HEAVY, i - 1, limit, 0, 0, reclaimed, 0, 0, 0, 0, 0, count_expired())
        return
      end
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
  if not any then
    r = answer(replies, r, UNLIMITED, -1, 0, 0, 0, reclaimed, 0, 0, 0, 0, 0, count_expired())
    return
  end
  local m, counted = 0, 0
  for i = 1, n do
    if limits[i] > 0 then m, counted = m + 1, counted + 2 ^ (i - 1); limited[m] = keys[i] end
  end
  local token = next_token(limited, m)
  if keep ~= 0 then token = keep end
  local plain = generated and weight == 1 and lease_ms == DEFAULT_LEASE_MS and not label
  local held, old_ms, old_token = put(limited[1], id, weight, lease_ms, token, plain)
  for i = 2, m do put(limited[i], id, weight, lease_ms, token, plain) end
  if label or held > 0 then -- (a label noted, or a re-admission's old one gone)
    for i = 1, m do
      if label then
        redis.call('HSET', limited[i].permits, HOLDER .. id, string.format('%d', now) .. ' ' .. label)
      else
        redis.call('HDEL', limited[i].permits, HOLDER .. id)
      end
    end
  end
  for i = 1, floors and n or 0 do
    if floors[i] and limits[i] > 0 then queue().hold_at(keys[i], level, floors[i], id, weight) end
  end
  if ticket then -- admitted: the ticket leaves, and the next in line hear their turn if there is room
    for i = 1, n do
      if keys[i].queued then queue().leave(keys[i], ticket, limits[i] - in_flight(keys[i]), true) end
    end
  end
  local first = keys[1]
  r = answer(replies, r, ADMITTED, -1, limits[1], limits[1] > 0 and first.n + first.extra or 0, now + lease_ms,
    reclaimed, token, held, old_ms, old_token, counted, count_expired(), shadowed)
end

-- A release from every key: 1 when any held a live lease, 0 when all were gone. On a key with a queue,
-- the tickets at its head that now fit hear their turn (queue.lua). A lease a later admission of the id
-- took (another token) stays.
local function release(keys, n, id, token)
  local released = 0
  for i = 1, n do
    local key = keys[i]
    reclaim(key) -- (an expired lease is not released: it was lost)
    local weight, _, own, found = meta(key, id, key.queued == nil)
    if (token == 0 or own == 0 or own == token) and redis.call('ZREM', key.leases, id) == 1 then
      released, key.n = 1, key.n - 1 -- (n: read again when the key is loaded)
      if found then
        add_extra(key, 1 - weight)
        redis.call('HDEL', key.permits, id, HOLDER .. id)
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

-- A record's head, {kind, flags (hex), number of keys}, parsed once a call (the loop reads heads first:
-- a call costs Redis more than a lookup), as a batch's records mostly share theirs.
local heads = {}
local function head(word)
  local kind, flags, n = string.match(word, '^(%a)(%x+)x?(%d*)$')
  heads[word] = {kind, tonumber(flags, 16), n ~= '' and tonumber(n) or 1}
  return heads[word]
end

clock_ms, now, now_us = clock(ARGV[1])
local ARGV, KEYS = ARGV, KEYS -- (locals: each read of a global costs Redis a lookup)
local a, terms, keys, placed = 2, {}, {}, {} -- placed: the keys by their place, looked up once a call
while a <= #ARGV do
  local h = heads[ARGV[a]] or head(ARGV[a])
  local kind, flags, n = h[1], h[2], h[3]
  for j = 1, n do
    local place = ARGV[a + j]
    local key = placed[place]
    if not key then
      local k = tonumber(place) * 3
      key = glance(KEYS[k - 2], KEYS[k - 1], KEYS[k])
      placed[place] = key
    end
    keys[j] = key
  end
  local f = a + n + 1 -- the operation's first field
  if kind == 'a' then
    local t = terms[ARGV[f + 1]] -- the operations of a batch mostly share their terms: read once
    if not t then
      t = {}
      for x in string.gmatch(ARGV[f + 1], '%d+') do t[#t + 1] = tonumber(x) end
      terms[ARGV[f + 1]] = t
    end
    local w, floors = nil, nil
    a = f + 2
    if flags % 4 >= 2 then -- a waiter's standing: ticket, level, flow and the ticket's lease
      local level, flow_weight = string.match(ARGV[a + 1], '^(%d+):(%d+)$')
      w = {ticket = ARGV[a] ~= '' and ARGV[a] or nil, level = tonumber(level), flow = ARGV[a + 2],
        ms = tonumber(ARGV[a + 3]), weight = t[1], flow_weight = tonumber(flow_weight)}
      -- (A slot handed to it is leased for as long as its ticket would have lasted: its waiter renews it.)
      if flags % 16 >= 8 then w.id, w.terms = ARGV[f], string.format('%d %d %d %d', t[1], math.min(t[2], w.ms), t[4], t[5]) end
      a = a + 4
    end
    if flags % 8 >= 4 then -- the floors of each key's class: {{{level, slots}, ...}, ...}
      floors = {}
      for group in string.gmatch(ARGV[a] .. ';', '([^;]*);') do
        local class = {}
        for lv, slots in string.gmatch(group, '(%d+):(%d+)') do class[#class + 1] = {tonumber(lv), tonumber(slots)} end
        floors[#floors + 1] = class
      end
      a = a + 1
    end
    local label, shadow = nil, nil
    if flags >= 16 then -- a label, a shadow mask
      if flags % 32 >= 16 then label, a = ARGV[a], a + 1 end
      if flags >= 32 then shadow, a = tonumber(ARGV[a]), a + 1 end
      if w then w.label = label end
    end
    acquire(keys, n, ARGV[f], t, flags % 2 == 1, w, floors, label, shadow)
  elseif kind == 'r' then
    r, a = r + 1, f + 2
    replies[r] = release(keys, n, ARGV[f], ARGV[f + 1] == '0' and 0 or tonumber(ARGV[f + 1]))
  elseif kind == 'u' then
    r, a = r + 1, f + 3
    replies[r] = undo(keys, n, ARGV[f], tonumber(ARGV[f + 1]), ARGV[f + 2])
  else -- 'l'
    local left = 0
    for j = 1, n do
      if queue().give_up(keys[j], ARGV[f]) then left = 1 end
    end
    r, a = r + 1, f + 1
    if flags % 16 >= 8 then
      if left == 0 then release(keys, n, ARGV[f + 1], 0) end
      a = a + 1
    end
    replies[r] = left
  end
end
write_tokens()
return replies
