-- quota.lua: a key's balance and its reservations. Every call first refunds the key's reservations whose
-- ttl has passed (a crashed holder loses no credit) and forgets old settlements.
-- KEYS[1] <prefix>{E}:quota         hash: balance, reserved. Absent: the key is unmetered. Configuration:
--                                   no TTL.
-- KEYS[2] <prefix>{E}:reservations  sorted set: id -> deadline (ms, Redis clock), the open reservations
-- KEYS[3] <prefix>{E}:amounts       hash: id -> its amount while open; once settled, while remembered,
--                                   'c' (committed), 'r' (refunded) or 'x' (expired)
-- KEYS[4] <prefix>{E}:settled       sorted set: id -> when it is forgotten (ms), the settled ones
-- KEYS[5] <prefix>{E}:funded        hash: idempotency key -> '<s|a>:<amount>:<balance>:<reserved>', the
--                                   fundings applied and their answers, while remembered
-- KEYS[6] <prefix>{E}:fundings      sorted set: idempotency key -> when it is forgotten (ms); both
--                                   expire (PEXPIRE) once every key in them is forgotten
-- ARGV[1] the operation, ARGV[2] clock offset ms, ARGV[3] how long a settlement is remembered (ms),
-- ARGV[4] the most reservations open (and remembered) per key; then per operation:
--   'f' fund:    ARGV[5] 's' (set) or 'a' (add), ARGV[6] the amount, ARGV[7] the largest balance,
--                ARGV[8] the idempotency key, ARGV[9] how long it is remembered (ms), ARGV[10] the
--                most idempotency keys remembered (the one forgotten soonest goes first)
--   'b' balance
--   'r' reserve: ARGV[5] id, ARGV[6] amount, ARGV[7] ttl ms
--   's' settle:  ARGV[5] id, ARGV[6] 'c' (commit) or 'r' (refund)
--   'e' extend:  ARGV[5] id, ARGV[6] ttl ms (the open reservation's deadline moves to a ttl from now)
-- Returns {outcome, balance, reserved, expired (reservations refunded by this call), expires_at_ms}:
--   every operation: -1 the key is unmetered (nothing recorded);
--   fund: 1 done, -2 the balance would pass the largest (nothing changed, nothing remembered),
--         3 done before under this idempotency key (nothing changed; the balance and reserved as
--         answered then), -4 the idempotency key was used for another funding (nothing changed);
--   balance: 1;
--   reserve: 1 reserved (an id already open: its deadline moved, nothing taken again), 0 exhausted,
--            2 the id ended a moment ago (nothing taken), -3 too many open (nothing taken);
--   settle: 1 settled, 2 settled that way already, 0 no open reservation under the id;
--   extend: 1 extended, 0 no open reservation under the id (nothing changed).
-- Atomic so that the balance never goes below zero and every amount is in exactly one place: the
-- balance, an open reservation, or spent; so that a reservation is settled once; and so that a funding
-- re-sent (the cluster client re-sends a command whose connection dropped) applies once.
clock_ms, now, now_us = clock(ARGV[2])
local quota, open, amounts, settled = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local remember_ms, most = tonumber(ARGV[3]), tonumber(ARGV[4])
local op = ARGV[1]
local upto = string.format('%.0f', now)
local function int(n) return string.format('%.0f', n) end -- (no exponent, whatever the size)

local function state(outcome, expired, expires_at)
  local b = redis.call('HMGET', quota, 'balance', 'reserved')
  return {outcome, tonumber(b[1] or '0'), tonumber(b[2] or '0'), expired, expires_at or 0}
end

local function remember(id, ended) -- as settled; the oldest forgotten past `most`
  redis.call('HSET', amounts, id, ended)
  redis.call('ZADD', settled, int(now + remember_ms), id)
  if redis.call('ZCARD', settled) > most then
    local oldest = redis.call('ZPOPMIN', settled)
    redis.call('HDEL', amounts, oldest[1])
  end
end

local function sweep() -- refunds the expired reservations; returns how many
  local expired = redis.call('ZRANGEBYSCORE', open, '-inf', upto)
  local back = 0
  for _, id in ipairs(expired) do
    back = back + (tonumber(redis.call('HGET', amounts, id) or '0') or 0)
    remember(id, 'x')
  end
  if #expired > 0 then
    redis.call('ZREMRANGEBYSCORE', open, '-inf', upto)
    redis.call('HINCRBY', quota, 'balance', int(back))
    redis.call('HINCRBY', quota, 'reserved', int(-back))
  end
  local forgotten = redis.call('ZRANGEBYSCORE', settled, '-inf', upto)
  for _, id in ipairs(forgotten) do redis.call('HDEL', amounts, id) end
  if #forgotten > 0 then redis.call('ZREMRANGEBYSCORE', settled, '-inf', upto) end
  return #expired
end

local function forget_fundings() -- the idempotency keys whose time has passed
  local gone = redis.call('ZRANGEBYSCORE', KEYS[6], '-inf', upto)
  for _, key in ipairs(gone) do redis.call('HDEL', KEYS[5], key) end
  if #gone > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', upto) end
end

local function remember_funding(key, answer, keep_ms, keep_most) -- room made first: this one is kept
  if redis.call('ZCARD', KEYS[6]) >= keep_most then
    local soonest = redis.call('ZPOPMIN', KEYS[6])
    redis.call('HDEL', KEYS[5], soonest[1])
  end
  redis.call('HSET', KEYS[5], key, answer)
  redis.call('ZADD', KEYS[6], int(now + keep_ms), key)
  if redis.call('PTTL', KEYS[5]) < keep_ms then
    redis.call('PEXPIRE', KEYS[5], int(keep_ms))
    redis.call('PEXPIRE', KEYS[6], int(keep_ms))
  end
end

local metered = redis.call('EXISTS', quota) == 1
if op == 'f' then
  local expired = metered and sweep() or 0
  forget_fundings()
  local key, asked = ARGV[8], ARGV[5] .. ':' .. ARGV[6] .. ':'
  local before = redis.call('HGET', KEYS[5], key)
  if before then
    if string.sub(before, 1, #asked) ~= asked then return state(-4, expired) end
    local balance, reserved = string.match(string.sub(before, #asked + 1), '^(%d+):(%d+)$')
    return {3, tonumber(balance), tonumber(reserved), expired, 0}
  end
  local n, largest = tonumber(ARGV[6]), tonumber(ARGV[7])
  local balance = n
  if ARGV[5] == 'a' then balance = balance + tonumber(redis.call('HGET', quota, 'balance') or '0') end
  if balance > largest then return state(-2, expired) end
  redis.call('HSET', quota, 'balance', int(balance))
  if not metered then redis.call('HSET', quota, 'reserved', '0') end
  local out = state(1, expired)
  remember_funding(key, asked .. int(out[2]) .. ':' .. int(out[3]), tonumber(ARGV[9]), tonumber(ARGV[10]))
  return out
end
if not metered then return {-1, 0, 0, 0, 0} end
local expired = sweep()
if op == 'b' then return state(1, expired) end

local id = ARGV[5]
local held = redis.call('HGET', amounts, id)
local amount = held and tonumber(held)
if op == 'e' then
  if not amount then return state(0, expired) end
  local deadline = now + tonumber(ARGV[6])
  redis.call('ZADD', open, int(deadline), id)
  return state(1, expired, deadline)
end
if op == 'r' then
  local deadline = now + tonumber(ARGV[7])
  if amount then
    redis.call('ZADD', open, int(deadline), id)
    return state(1, expired, deadline)
  end
  if held then return state(2, expired) end
  if redis.call('ZCARD', open) >= most then return state(-3, expired) end
  amount = tonumber(ARGV[6])
  if tonumber(redis.call('HGET', quota, 'balance')) < amount then return state(0, expired) end
  redis.call('HINCRBY', quota, 'balance', int(-amount))
  redis.call('HINCRBY', quota, 'reserved', int(amount))
  redis.call('ZADD', open, int(deadline), id)
  redis.call('HSET', amounts, id, int(amount))
  return state(1, expired, deadline)
end

-- settle
local how = ARGV[6]
if not amount then return state(held == how and 2 or 0, expired) end
redis.call('ZREM', open, id)
remember(id, how)
redis.call('HINCRBY', quota, 'reserved', int(-amount))
if how == 'r' then redis.call('HINCRBY', quota, 'balance', int(amount)) end
return state(1, expired)
