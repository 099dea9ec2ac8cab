-- status.lua: reads a key, after setting or clearing its override when asked to.
-- KEYS[1] leases, KEYS[2] permits, KEYS[3] limit
-- ARGV[1] default limit, ARGV[2] max limit, ARGV[3] override ('' leave, '0' clear, 'n' set), ARGV[4]
-- clock offset ms. Returns {limit, override (0: none), in_flight}.
-- Atomic so that the answer describes one moment: the override and the count as they were together.
set_now(tonumber(ARGV[4]))
if ARGV[3] ~= '' then
  if tonumber(ARGV[3]) > 0 then redis.call('SET', KEYS[3], ARGV[3]) else redis.call('DEL', KEYS[3]) end
end
local key = view(KEYS[1], KEYS[2], KEYS[3])
return {resolve(override(key), tonumber(ARGV[1]), tonumber(ARGV[2])), override(key), in_flight(key)}
