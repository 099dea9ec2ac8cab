-- base.lua: the names every script on user keys shares (common.lua describes their data), first in each
-- entry point of the manifest. Small, since it is made on every call (lone.lua's too).
-- Twins: resolve() is ClassLimits::resolve (crates/inflight/src/limit.rs) and the Python client's (_policy.py).
local DEFAULT_LEASE_MS = 30000
local QUEUED = '\254q'
-- In a key's permits hash (common.lua), beside a lease's entry: HOLDER .. id, 'admitted_ms label' (a
-- labelled lease, or a plain one once renewed); REVOKED .. id while a revoked lease's holder may renew it.
local HOLDER, REVOKED = '\254h', '\254r'

-- An admission's answer, one structure for every script that admits (batch.lua, lone.lua, dify.lua): into
-- `out` after its first `at` numbers; returns how many it then holds. Named once here, in this order, as
-- crates/inflight/src/store/redis/answer.rs's `Answer` and the Python client's `_core.Answer` name it.
-- decision: FULL, ADMITTED, UNLIMITED (nothing recorded), TOO_HEAVY (the weight is over the limit), WAITS
-- (full, and the waiter's ticket is in the refusing key's queue), WAITERS_BOUND (full, the queue at its
-- bound); index: the refusing key's place among the operation's (0-based; -1); limit and in_flight: that
-- key's, or the first's; held_*: what the id held before on the first limited key (weight 0: nothing);
-- counted: which keys recorded the lease (bit i - 1: key i); tickets_expired: tickets of its keys'
-- queues it found expired (their waiters' processes stopped renewing them); shadowed (in counted's bits
-- 16 to 31): which keys of the admission's shadow mask (batch.lua's flag 32) it went past the limit of
-- (bit i - 1: key i).
local FULL, ADMITTED, UNLIMITED, TOO_HEAVY, WAITS, WAITERS_BOUND = 0, 1, 2, 3, 4, 5
local function answer(out, at, decision, index, limit, in_flight, expires_at_ms, reclaimed, token, held_weight,
    held_lease_ms, held_token, counted, tickets_expired, shadowed)
  out[at + 1], out[at + 2], out[at + 3], out[at + 4] = decision, index, limit, in_flight
  out[at + 5], out[at + 6], out[at + 7], out[at + 8] = expires_at_ms, reclaimed, token, held_weight
  -- (counted's bits 16-31, as an admission has at most 16 keys: one number fewer to answer per admission)
  out[at + 9], out[at + 10] = held_lease_ms, held_token
  out[at + 11], out[at + 12] = shadowed and counted + shadowed * 65536 or counted, tickets_expired
  return at + 12
end
local clock_ms, now, now_us = 0, 0, 0 -- the Redis clock at the script's start; now adds the tests' offset
-- Their values, which each script sets first (`clock_ms, now, now_us = clock(ARGV[i])`: a function setting
-- them would capture them, which costs Redis on every call).
local function clock(offset)
  local offset_ms = offset == '0' and 0 or tonumber(offset)
  local t = redis.call('TIME')
  local s, us = t[1] + 0, t[2] + 0 -- (tonumber costs Redis twice as much)
  local ms = s * 1000 + (us - us % 1000) / 1000
  return ms, ms + offset_ms, s * 1000000 + us + offset_ms * 1000
end

-- The effective limit: the override if > 0, else the default; capped by the ceiling if > 0; 0: unlimited.
local function resolve(override, default_limit, max_limit)
  local own = override > 0 and override or default_limit
  if own == 0 or (max_limit > 0 and own > max_limit) then return max_limit end
  return own
end

-- An override counts when it is a whole number from 1 to MAX_OVERRIDE (2^32 - 1, what every client reads);
-- anything else a writer left (larger, smaller, a fraction, text) reads as none: the key's class limits
-- apply. Writes are refused unless they read back (override_arg).
local MAX_OVERRIDE = 4294967295
local function override_of(text)
  local n = text and tonumber(text)
  if n and n >= 1 and n <= MAX_OVERRIDE and n == math.floor(n) then return n end
  return 0
end

-- A number from the text of one the scripts wrote ('0' read as is; tonumber costs twice what `+ 0` does).
local function num(text)
  if not text or text == '0' then return 0 end
  return text + 0
end
