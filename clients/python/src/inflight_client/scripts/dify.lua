-- dify.lua: Dify's key layout (`DifyStore`), shared with unmodified Dify workers during a migration.
-- KEYS, four for each user key K (P: Dify's REDIS_KEY_PREFIX and a colon, or ''; H: Pdify:rate_limit:K:active_requests):
--   H                   hash: request id -> epoch seconds as text (Dify's own; HLEN is the count)
--   {H}:leases          sorted set: inflight's request ids -> lease deadline (ms); same slot as H
--   {H}:lease_ms        hash: inflight's request ids -> lease length, for lengths other than the default
--   Pdify:rate_limit:K:max_active_requests  string: the app's limit (Dify's), here its override
-- Beside them, under the tag {H}, a queue of waiters as queue.lua keeps one ({H}:queue, ...), flagged in
-- {H}:lease_ms (queue.lua's QUEUED).
-- ARGV[1] 'a' acquire, 'r' release, 'n' renew, 's' status, 'l' a waiter gives up its ticket (ARGV[2]);
-- ARGV[2] request id; ARGV[3] clock offset ms;
-- ARGV[4] lease ms (renew: 0 keeps the lease's own); ARGV[5] age after which an entry without a lease
-- (a Dify worker's) is stale, ms; ARGV[6] renew: re-add (1) or not (0); status: '' leave the override,
-- '0' clear it, 'n' set it; ARGV[6 + i] 'default max' of key i's class (n keys). Status only: KEYS[5]
-- <prefix>overrides (hash: user key -> override, to bound them), ARGV[8] the bound (0: none), ARGV[9] K.
-- A waiter's admission: ARGV[7 + n] its ticket, ARGV[8 + n] 'level:flow_weight', ARGV[9 + n] its flow,
-- ARGV[10 + n] the ticket's lease ms, ARGV[11 + n] '1' (one key): a release may hand it the slot (queue.lua's
-- hand_off, which admits it with key.admit).
-- Returns an admission's answer (common.lua's), {released},
-- renew.lua's 5 numbers, status.lua's 3 ({-1, bound, 0} when a new override would pass the bound), {left}.
-- Atomic for the reason Dify's HLEN-then-HSET is not: counting and adding must be one step.
-- Every entry counts one (weight 1). inflight's entries carry, as Dify's "start time", the later of the
-- Redis clock and their lease's end less the stale age, rewritten by every renewal: Dify's workers (which
-- evict entries older than the stale age, 600 s) never evict a live one, however long its lease.
-- An admission keeps Dify's limit key alive as Dify's workers do (a day from their last flush), so the
-- limit they wrote outlives them; an override inflight set (no expiry) is left as it is.
local op, id, lease_ms, stale_ms = ARGV[1], ARGV[2], tonumber(ARGV[4]), tonumber(ARGV[5])
clock_ms, now, now_us = clock(ARGV[3])
local DAY_MS, FLUSH_MS = 86400000, 300000 -- Dify's expiry of its limit key; how often its workers renew it

local keys, reclaimed, n_keys = {}, 0, math.floor(#KEYS / 4)
for i = 1, n_keys do
  local lengths = KEYS[i * 4 - 1]
  local key = {hash = KEYS[i * 4 - 3], leases = KEYS[i * 4 - 2], lengths = lengths, permits = lengths, limit = KEYS[i * 4],
    extra = 0} -- (every entry weighs 1: common.lua's in_flight is n)
  -- inflight's expired leases go with their entries.
  local upto = string.format('%d', now)
  for _, gone in ipairs(redis.call('ZRANGEBYSCORE', key.leases, '-inf', upto)) do
    redis.call('HDEL', key.hash, gone)
    redis.call('HDEL', key.lengths, gone)
    reclaimed = reclaimed + 1
  end
  redis.call('ZREMRANGEBYSCORE', key.leases, '-inf', upto)
  key.n = redis.call('HLEN', key.hash)
  if op == 'a' or op == 'r' or op == 's' then key.queued = redis.call('HEXISTS', lengths, QUEUED) == 1 end
  override(key) -- (a value no client reads, such as one past 2^32 - 1, reads as none)
  if op == 'a' and key.override > 0 then
    local ttl = redis.call('PTTL', key.limit)
    if ttl >= 0 and ttl < DAY_MS - FLUSH_MS then redis.call('PEXPIRE', key.limit, DAY_MS) end
  end
  local default_limit, max_limit = string.match(ARGV[6 + i] or '0 0', '^(%d+) (%d+)$') -- (a release: none)
  key.limit_now = resolve(key.override, tonumber(default_limit), tonumber(max_limit))
  keys[i] = key
end

local function held(key) return redis.call('HEXISTS', key.hash, id) == 1 end

-- Entries without a lease (Dify's) older than the stale age: evicted, as Dify's own flush would, but
-- only when they stand in the way (the key is full), so an admission never scans a key with room.
local function evict_stale(key)
  local entries = redis.call('HGETALL', key.hash)
  for j = 1, #entries, 2 do
    local at = tonumber(entries[j + 1])
    if (not at or now - at * 1000 > stale_ms) and not redis.call('ZSCORE', key.leases, entries[j]) then
      redis.call('HDEL', key.hash, entries[j])
      key.n, reclaimed = key.n - 1, reclaimed + 1
    end
  end
end

local function room(key) -- whether one more entry fits
  if key.n + 1 <= key.limit_now then return true end
  evict_stale(key)
  return key.n + 1 <= key.limit_now
end

local function own_length(key) return tonumber(redis.call('HGET', key.lengths, id) or DEFAULT_LEASE_MS) end

local function keep_sides(key, ms) -- the side keys outlive every lease (so a holder's crash is reclaimed)
  -- Only ever extended: a short lease must not cut them below a longer lease's deadline (PTTL, not
  -- PEXPIRE's GT, which Redis 6 lacks and which never sets an expiry on a key that has none).
  local keep = math.max(ms * 2, stale_ms) + 1000
  for _, side in ipairs({key.leases, key.lengths}) do
    if redis.call('PTTL', side) < keep then redis.call('PEXPIRE', side, keep) end
  end
end

-- Adds or refreshes `who`'s entry and lease (H is Dify's, left without expiry); its token: 0. As key.admit,
-- it admits a slot queue.lua's hand_off hands.
local function put_entry(key, who, ms)
  local stamp = string.format('%.3f', math.max(now, now + ms - stale_ms) / 1000)
  if redis.call('HSET', key.hash, who, stamp) == 1 then key.n = key.n + 1 end
  redis.call('ZADD', key.leases, string.format('%d', now + ms), who)
  if ms == DEFAULT_LEASE_MS then redis.call('HDEL', key.lengths, who) else redis.call('HSET', key.lengths, who, ms) end
  keep_sides(key, ms)
  return 0
end

-- An admission's answer (common.lua's): no token, nothing held before (Dify's entries keep neither).
local function reply(decision, index, limit, in_flight, expires_at_ms)
  local out = {}
  answer(out, 0, decision, index, limit, in_flight, expires_at_ms, reclaimed, 0, 0, 0, 0, 0, count_expired())
  return out
end

if op == 'a' then
  local b, w = 6 + n_keys, nil -- a waiter's standing, as batch.lua takes it
  if ARGV[b + 1] then
    local level, flow_weight = string.match(ARGV[b + 2], '^(%d+):(%d+)$')
    w = {ticket = ARGV[b + 1], level = tonumber(level), flow_weight = tonumber(flow_weight), flow = ARGV[b + 3],
      ms = tonumber(ARGV[b + 4]), weight = 1}
    if ARGV[b + 5] == '1' and n_keys == 1 then -- (as batch.lua's flags 8)
      w.id, w.terms = id, string.format('1 %d %s', math.min(lease_ms, w.ms), ARGV[7])
    end
  end
  local ticket, any = w and w.ticket, false
  for i, key in ipairs(keys) do
    if key.limit_now > 0 then
      any = true
      -- No room, or none behind the tickets ahead (queue.lua); a held id needs none.
      if not held(key) and not (room(key) and (not key.queued or queue().in_turn(key, key.limit_now - key.n, 1, ticket))) then
        local decision = FULL
        if ticket then -- its ticket waits here, and in no other key's queue
          for j, other in ipairs(keys) do
            if j ~= i and other.queued then queue().leave(other, ticket, 1, false) end
          end
          decision = queue().take_ticket(key, w, key.limit_now) == 1 and WAITS or WAITERS_BOUND
          keep_sides(key, DEFAULT_LEASE_MS)
        end
        return reply(decision, i - 1, key.limit_now, key.n, 0)
      end
    end
  end
  if not any then return reply(UNLIMITED, -1, 0, 0, 0) end
  for _, key in ipairs(keys) do
    if key.limit_now > 0 then put_entry(key, id, lease_ms) end
    -- Admitted: its ticket leaves, and the next in line hear their turn if there is room.
    if ticket and key.queued then queue().leave(key, ticket, key.limit_now - key.n, true) end
  end
  local first = keys[1]
  return reply(ADMITTED, -1, first.limit_now, first.limit_now > 0 and first.n or 0, now + lease_ms)
elseif op == 'l' then
  local left = 0
  for _, key in ipairs(keys) do
    if queue().give_up(key, id) then left = 1 end
  end
  return {left}
elseif op == 'r' then
  local released = 0
  for _, key in ipairs(keys) do
    if redis.call('ZREM', key.leases, id) == 1 then released = 1 end
    if redis.call('HDEL', key.hash, id) == 1 then
      key.n, key.admit = key.n - 1, put_entry
      if key.queued then queue().call_after_release(key, key.n, 1) end
    end
    redis.call('HDEL', key.lengths, id)
  end
  return {released}
elseif op == 'n' then
  -- As renew.lua: extended where held, taken where it fits on a key limited since; held nowhere: re-added
  -- when asked to and every limited key has room, else lost.
  local has, any_held, missing, length = {}, false, false, nil
  for i, key in ipairs(keys) do
    has[i] = redis.call('ZSCORE', key.leases, id) ~= false
    if has[i] and not length then length = own_length(key) end
    any_held = any_held or has[i]
    missing = missing or (key.limit_now > 0 and not has[i])
  end
  if lease_ms == 0 then lease_ms = length or DEFAULT_LEASE_MS end
  local outcome = 1
  if missing and not any_held then
    if ARGV[6] ~= '1' then return {0, 0, 0, 0, 0} end
    for _, key in ipairs(keys) do
      if key.limit_now > 0 and not held(key) and not room(key) then return {0, 0, 0, 0, 0} end
    end
    outcome = 2
  end
  for i, key in ipairs(keys) do
    if has[i] or (key.limit_now > 0 and (outcome == 2 or held(key) or room(key))) then put_entry(key, id, lease_ms) end
  end
  local first = keys[1]
  return {outcome, first.limit_now, first.limit_now > 0 and first.n or 0, 1, now + lease_ms}
else
  local key = keys[1]
  if ARGV[6] ~= '' then
    local max, value = tonumber(ARGV[8]), override_arg(ARGV[6])
    if not value then return redis.error_reply(OVERRIDE_RANGE) end
    if tonumber(value) > 0 then
      if max > 0 and redis.call('HEXISTS', KEYS[5], ARGV[9]) == 0 and redis.call('HLEN', KEYS[5]) >= max then
        return {-1, max, 0}
      end
      redis.call('SET', key.limit, value)
      redis.call('HSET', KEYS[5], ARGV[9], value)
    else
      redis.call('DEL', key.limit)
      redis.call('HDEL', KEYS[5], ARGV[9])
    end
    key.override = tonumber(value)
    local default_limit, max_limit = string.match(ARGV[7], '^(%d+) (%d+)$')
    key.limit_now = resolve(key.override, tonumber(default_limit), tonumber(max_limit))
    -- Room a new limit makes goes to the queue's head: its waiters hear their turn.
    if key.queued and key.limit_now > key.n then
      queue().expire_tickets(key)
      queue().call_turns(key, key.limit_now - key.n)
    end
  end
  return {key.limit_now, key.override, key.n}
end
