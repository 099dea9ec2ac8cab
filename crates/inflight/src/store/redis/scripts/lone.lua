-- lone.lua: one admission or one release on one key, the common call of a worker with one request in
-- flight, in fewer steps than batch.lua (whose every function Lua makes on every call). It takes one of
-- batch.lua's records: 'a0' or 'a1' (the token its lease keeps 0, no standing) or 'r0', on KEYS 1-3.
-- It does what batch.lua would, and only where that is simple: a key with no queue, no expired lease to
-- reclaim and no earlier lease of the id. Anything else it answers with nothing, having changed nothing,
-- and the caller sends the same record to batch.lua (the manifest's `lone`).
local ARGV, KEYS, call = ARGV, KEYS, redis.call -- (locals: each read of a global costs Redis a lookup)
clock_ms, now, now_us = clock(ARGV[1])
local kind, id, leases, permits = ARGV[2], ARGV[4], KEYS[1], KEYS[2]
if ARGV[3] ~= '1' or #KEYS ~= 3 then return {} end

if kind == 'r0' then
  local deadline = call('ZSCORE', leases, id)
  if not deadline then return {0} end
  if deadline + 0 <= now then return {} end -- expired: batch.lua reclaims it
  local fields = call('HMGET', permits, id, QUEUED)
  if fields[2] then return {} end -- the next in line hear their turn (queue.lua)
  if fields[1] then
    local weight, _, own = string.match(fields[1], '^(%d+) (%d+) ?(%d*)$')
    local token = ARGV[5]
    if token ~= '0' and own ~= '' and own ~= token then return {0} end -- a later admission's lease
    if weight ~= '1' then call('HINCRBY', permits, '', 1 - tonumber(weight)) end
    call('HDEL', permits, id, HOLDER .. id)
  end
  call('ZREM', leases, id)
  return {1}
end

if kind ~= 'a0' and kind ~= 'a1' then return {} end
local weight, lease_ms, keep, default_limit, max_limit = string.match(ARGV[5], '^(%d+) (%d+) (%d+) (%d+) (%d+)$')
if keep ~= '0' then return {} end
-- (the usual terms compared as text: tonumber costs Redis more than a comparison)
local w, ms = weight == '1' and 1 or weight + 0, lease_ms == '30000' and 30000 or lease_ms + 0
local fields = call('HMGET', permits, '', '#', QUEUED)
if fields[3] then return {} end
local extra, n = num(fields[1]), call('ZCARD', leases)
if n > 0 then
  local first = call('ZRANGE', leases, '0', '0', 'WITHSCORES')
  if first[2] + 0 <= now then return {} end
elseif extra ~= 0 then
  return {} -- a hash left without leases: batch.lua counts it anew
end
local count = n + extra
local limit = resolve(override_of(call('GET', KEYS[3])), default_limit + 0, max_limit == '0' and 0 or max_limit + 0)
local out = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0} -- (made at its size: answer() fills it without growing it)
if limit == 0 then
  answer(out, 0, UNLIMITED, -1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
elseif w > limit then
  answer(out, 0, TOO_HEAVY, 0, limit, 0, 0, 0, 0, 0, 0, 0, 0, 0)
elseif count + w > limit then
  if call('ZSCORE', leases, id) then return {} end -- a retry of an admission that holds it
  answer(out, 0, FULL, 0, limit, count, 0, 0, 0, 0, 0, 0, 0, 0)
else
  local expires_at_ms = now + ms
  if call('ZADD', leases, 'NX', string.format('%d', expires_at_ms), id) == 0 then return {} end
  local last = num(fields[2])
  local token = last < now_us and now_us or last + 1
  local token_text = string.format('%d', token)
  -- Both expire at one instant, a while past every deadline (common.lua's keep()).
  local ttl = n > 0 and call('PTTL', leases) or -1
  local renewed = ttl < ms + 1000
  if renewed then ttl = ms * 2 + 1000 end
  local at = string.format('%d', clock_ms + ttl)
  if renewed then call('PEXPIREAT', leases, at) end
  if kind == 'a1' and w == 1 and ms == DEFAULT_LEASE_MS then -- a fresh lease: no entry
    call('HSET', permits, '#', token_text, '', fields[1] or '0')
  else
    local entry = weight .. ' ' .. lease_ms .. ' ' .. token_text
    call('HSET', permits, '#', token_text, '', string.format('%d', extra + w - 1), id, entry)
  end
  call('PEXPIREAT', permits, at)
  answer(out, 0, ADMITTED, -1, limit, count + w, expires_at_ms, 0, token, 0, DEFAULT_LEASE_MS, 0, 1, 0)
end
return out
