-- holders.lua: a key's holders and waiters listed, or one of them revoked (an operator's calls).
-- KEYS: leases, permits, limit of the key (common.lua; its queue's names share their tag, queue.lua).
-- ARGV[1] clock offset ms, ARGV[2] the call:
--   'list', ARGV[3] the cursor of ZSCAN over the leases ('0': the first page): reads only. Returns
--     {next cursor, {id, deadline, entry, holder field, ...}, {member, info, ...}}: the page's unexpired
--     leases with their entries ('' when none) and HOLDER fields (''), and on the first page the first
--     PAGE tickets in queue order with their '@' fields ('').
--   'revoke', ARGV[3] a permit id: its lease removed whatever its token, REVOKED noted for its holder's
--     renewal (renew.lua) until the key's hash goes, and the freed slots called as a release's are
--     (queue.lua). 1 when it held a lease.
--   'revoke_waiter', ARGV[3] a ticket: given up (queue.lua's give_up), and its process told
--     ('<n>!' on its channel). 1 when it was in the queue.
local PAGE = 100
clock_ms, now, now_us = clock(ARGV[1])
local call, arg = ARGV[2], ARGV[3]
local t = string.sub(KEYS[1], 1, -8) -- the key's tag, which its queue's names share (queue.lua)

if call == 'list' then
  local scanned = redis.call('ZSCAN', KEYS[1], arg, 'COUNT', PAGE)
  local holders, waiters = {}, {}
  local found = scanned[2]
  for i = 1, #found, 2 do
    local id, deadline = found[i], found[i + 1]
    if tonumber(deadline) > now then
      local fields = redis.call('HMGET', KEYS[2], id, HOLDER .. id)
      for _, v in ipairs({id, deadline, fields[1] or '', fields[2] or ''}) do holders[#holders + 1] = v end
    end
  end
  if arg == '0' then
    local expiry = t .. ':expiry'
    for _, member in ipairs(redis.call('ZRANGE', t .. ':queue', 0, PAGE - 1)) do
      local ticket = string.match(member, '^%x+ %d+ (.+)$')
      local ends = redis.call('ZSCORE', expiry, ticket)
      if ends and tonumber(ends) > now then
        waiters[#waiters + 1] = member
        waiters[#waiters + 1] = redis.call('HGET', t .. ':tickets', '@' .. ticket) or ''
      end
    end
  end
  return {scanned[1], holders, waiters}
end

local key = view(KEYS[1], KEYS[2], KEYS[3])
if call == 'revoke' then
  local deadline = redis.call('ZSCORE', key.leases, arg)
  if not deadline or tonumber(deadline) <= now then return 0 end
  local weight, lease_ms, _, found = meta(key, arg, key.queued == nil)
  redis.call('ZREM', key.leases, arg)
  key.n = key.n - 1
  if found then
    add_extra(key, 1 - weight)
    redis.call('HDEL', key.permits, arg, HOLDER .. arg)
  end
  redis.call('HSET', key.permits, REVOKED .. arg, 1)
  hashed(key)
  keep(key, lease_ms, false) -- (the hash outlives the lease's next renewal)
  if key.queued then queue().call_after_release(key, in_flight(key), weight) end
  return 1
end

-- 'revoke_waiter' (a ticket not in the queue, or given up, is left alone: nothing is noted for it)
local member = redis.call('HGET', t .. ':tickets', arg)
if not member or member == '-' or not queue().give_up(key, arg) then return 0 end
local channel, n = string.match(arg, '^(.*)#(%d+)$')
if channel then redis.call('PUBLISH', channel, n .. '!') end
return 1
