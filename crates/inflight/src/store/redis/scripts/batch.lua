-- batch.lua: the admissions and releases that were waiting to be sent, in one call.
-- KEYS: 3 per user key of the batch, each user key once: leases, weights, limit (see common.lua).
-- ARGV[1] clock offset ms; then the operations in order, each led by its user key's place p among the
-- KEYS (1 for the first three, 2 for the next three, ...):
--   an admission: p, permit id, its terms 'weight lease_ms default_limit max_limit' (one argument: the
--                 operations of a batch mostly share their terms, which are then read once)
--   a release:    -p, permit id
-- Returns the replies one after another in one flat array: 5 numbers for an admission, 1 for a release
-- (see ops.lua).
-- Each operation is one atomic decision, as it must be (reading the override, counting and adding as
-- separate round trips lets N workers go N - 1 over the limit); running the waiting ones together only
-- spares Redis the cost of a script call per operation, which is most of the cost of one.
local now = now_ms(tonumber(ARGV[1]))
local terms = {}
local replies, r, a = {}, 0, 2
while a <= #ARGV do
  local p = tonumber(ARGV[a])
  if p > 0 then
    local k, t = (p - 1) * 3, terms[ARGV[a + 2]]
    if not t then
      local weight, lease_ms, default_limit, max_limit = string.match(ARGV[a + 2], '^(%d+) (%d+) (%d+) (%d+)$')
      t = {tonumber(weight), tonumber(lease_ms), tonumber(default_limit), tonumber(max_limit)}
      terms[ARGV[a + 2]] = t
    end
    replies[r + 1], replies[r + 2], replies[r + 3], replies[r + 4], replies[r + 5] =
      acquire(KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], ARGV[a + 1], t[1], t[2], t[3], t[4], now)
    r, a = r + 5, a + 3
  else
    local k = (-p - 1) * 3
    replies[r + 1] = release(KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], ARGV[a + 1], now)
    r, a = r + 1, a + 2
  end
end
finish()
return replies
