-- batch.lua: the admissions and releases that were waiting to be sent, in one call.
-- KEYS: 3 per operation, in order: leases, weights, limit (see common.lua).
-- ARGV[1] clock offset ms; then 6 per operation: 'a' (acquire) or 'r' (release), permit id, weight,
-- lease ms, default limit, max limit (a release reads only its id).
-- Returns one reply per operation, in order (see ops.lua).
-- Each operation is one atomic decision, as it must be (reading the override, counting and adding as
-- separate round trips lets N workers go N - 1 over the limit); running the waiting ones together only
-- spares Redis the cost of a script call per operation, which is most of the cost of one.
local now = now_ms(tonumber(ARGV[1]))
local replies = {}
for i = 0, #KEYS / 3 - 1 do
  local k, a = i * 3, 1 + i * 6
  if ARGV[a + 1] == 'a' then
    replies[i + 1] = acquire(KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], ARGV[a + 2], tonumber(ARGV[a + 3]),
      tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5]), tonumber(ARGV[a + 6]), now)
  else
    replies[i + 1] = release(KEYS[k + 1], KEYS[k + 2], ARGV[a + 2], now)
  end
end
return replies
