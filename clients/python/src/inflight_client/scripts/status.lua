-- status.lua: reads a key, after setting or clearing its override when asked to.
-- KEYS[1] leases, KEYS[2] permits, KEYS[3] limit; KEYS[4] <prefix>overrides (hash: user key -> its
-- override, for every key that has one), KEYS[5] <prefix>overrides:version (counts the changes); on
-- Redis Cluster KEYS[4] and KEYS[5] are left out (they are in another slot) and index.lua keeps them
-- ARGV[1] default limit, ARGV[2] max limit, ARGV[3] override ('' leave, '0' clear, 'n' set, refused past
-- MAX_OVERRIDE), ARGV[4]
-- clock offset ms, ARGV[5] the user key, ARGV[6] the channel that announces changes of overrides,
-- ARGV[7] the most keys with an override (0: no bound).
-- Returns {limit, override (0: none), in_flight, version}, version being the index's after a change (0 when
-- none was asked for, or on a cluster), so that the process's view holds the change as of that version;
-- or {-1, the bound, 0, 0} when a new override would pass the bound.
-- Atomic so that the answer describes one moment: the override and the count as they were together; and
-- so that the override, its entry in the index and the announcement 'version +key' (or '-key') that
-- keeps every process's view of the index fresh never disagree.
clock_ms, now, now_us = clock(ARGV[4])
local version = 0
if ARGV[3] ~= '' then
  local value = override_arg(ARGV[3])
  if not value then return redis.error_reply(OVERRIDE_RANGE) end
  local set, changed, max, indexed = tonumber(value) > 0, 0, tonumber(ARGV[7] or '0'), #KEYS > 3
  if indexed and set and max > 0 and redis.call('HEXISTS', KEYS[4], ARGV[5]) == 0 and redis.call('HLEN', KEYS[4]) >= max then
    return {-1, max, 0, 0}
  end
  if set then
    redis.call('SET', KEYS[3], value)
    if indexed then changed = redis.call('HSET', KEYS[4], ARGV[5], value) end
  else
    redis.call('DEL', KEYS[3])
    if indexed then changed = redis.call('HDEL', KEYS[4], ARGV[5]) end
  end
  -- The view holds which keys have an override, not their values: announced when the index gains or
  -- loses the key (so an override set before the index existed is announced when it is set again).
  if changed == 1 then
    version = redis.call('INCR', KEYS[5])
    redis.call('PUBLISH', ARGV[6], version .. ' ' .. (set and '+' or '-') .. ARGV[5])
  elseif indexed then
    version = tonumber(redis.call('GET', KEYS[5]) or '0')
  end
end
local key = view(KEYS[1], KEYS[2], KEYS[3])
local limit = resolve(override(key), tonumber(ARGV[1]), tonumber(ARGV[2]))
-- Room a new limit makes goes to the queue's head (queue.lua): its waiters hear their turn.
if ARGV[3] ~= '' and key.queued and limit > in_flight(key) then
  queue().expire_tickets(key)
  queue().call_turns(key, limit - in_flight(key))
end
return {limit, override(key), in_flight(key), version}
