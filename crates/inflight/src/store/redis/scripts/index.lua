-- index.lua: on Redis Cluster, the index of overrides, changed beside the override itself (status.lua)
-- because it lives in another slot. The store keeps the index a superset of the keys with an override:
-- it adds a key before setting its override and removes it after clearing it (then looks again), so a
-- view built from the index never misses an override, at worst it asks Redis about a key that has none.
-- KEYS[1] <prefix>{overrides} (hash: user key -> its override), KEYS[2] <prefix>{overrides}:version
-- ARGV[1] '+' (add the key) or '-' (remove it), ARGV[2] the user key, ARGV[3] its override, ARGV[4] the
-- channel that announces changes, ARGV[5] the most keys with an override (0: no bound).
-- Returns the index's version after the call (a change is announced as 'version +key' or '-key'), or -1
-- when adding the key would pass the bound.
-- Atomic so that the index, its version and the announcement never disagree.
local changed
if ARGV[1] == '+' then
  local max = tonumber(ARGV[5])
  if max > 0 and redis.call('HEXISTS', KEYS[1], ARGV[2]) == 0 and redis.call('HLEN', KEYS[1]) >= max then
    return -1
  end
  changed = redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
else
  changed = redis.call('HDEL', KEYS[1], ARGV[2])
end
if changed == 1 then
  local version = redis.call('INCR', KEYS[2])
  redis.call('PUBLISH', ARGV[4], version .. ' ' .. ARGV[1] .. ARGV[2])
  return version
end
return tonumber(redis.call('GET', KEYS[2]) or '0')
