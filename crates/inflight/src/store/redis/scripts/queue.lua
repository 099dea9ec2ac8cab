-- queue.lua: a key's queue of waiters, one for every process sharing the store (batch.lua, status.lua,
-- dify.lua).
-- A waiter refused as full takes a ticket, in the step that refused it; the order of the tickets
-- decides who is admitted next, whichever process they wait in. Beside common.lua's names, under the
-- key's tag T (<prefix>{E}):
--   T:queue    sorted set, every score 0, so in member order: 'PPRRRRRRRRRRSSSSSSSSSS w ticket': PP
--              255 - priority, R the ticket's round among its level's flows, S its arrival number on the
--              key (hex, fixed width), w its weight. The head is the first member.
--   T:tickets  hash: ticket -> its member, or GIVEN_UP for GIVEN_UP_MS once its waiter gave it up (an
--              ask of the waiter still on its way, sent again after a NOSCRIPT or late, then takes no
--              place nobody waits in); '' -> the last arrival number; 'L' -> the key's limit as the last
--              ticket taken found it (for releases, which know no limit).
--              '@' .. ticket -> 'since_ms flow_length flow label' (holders.lua lists it).
--   T:expiry   sorted set: ticket -> the end of its lease (ms). A ticket its process stops renewing
--              (killed, cut off) goes when that passes.
--   T:flows    hash: 'level flow' -> the flow's next round * FLOW_STEP + the tickets it took in that
--              round (a flow of weight w takes w tickets a round); 'level' -> the last round admitted.
--   permits QUEUED (common.lua) is there while the key may have a queue (whoever finds it empty clears it): one more
--   field of reads the scripts make anyway tells an admission or a release that nobody waits. (dify.lua:
--   key.permits is its hash of lease lengths.)
-- A ticket is '<channel>#<n>': its process hears its turn on <channel> (PUBLISH '<n> <n2> ...').
-- Order: priority (higher first), then round (each flow of a level takes the next round it has not
-- had, so flows are served in turn however many tickets one of them holds), then arrival.
-- An admission takes a slot only when the tickets ahead of it (all of them, for one without a ticket:
-- no barging) leave room for it too.
local MAX_TICKETS, MAX_FLOWS, SCAN = 10000, 1000, 64
local FLOW_STEP = 1024 -- a flow's entry: its next round * FLOW_STEP + the tickets it took in that round
local tickets_expired = 0 -- since the last count_expired()

-- How many tickets were found expired since the last call (an admission reports those it found).
local function count_expired()
  local n = tickets_expired
  tickets_expired = 0
  return n
end

-- The queue's functions, made on a call's first use of a queue (Lua makes every function of a script's
-- top level on every call: a call that meets no queue, as most do, does not pay for these).
local made_queue
local function queue()
  if made_queue then return made_queue end
  local GIVEN_UP, GIVEN_UP_MS = '-', 10000

  local function tag_of(key)
    key.tag = key.tag or string.sub(key.leases, 1, -8)
    return key.tag
  end

  local function parse_member(member) -- weight, ticket
    local w, ticket = string.match(member, '^%x+ (%d+) (.+)$')
    return tonumber(w), ticket
  end

  local function drop_ticket(t, ticket, member)
    if member then redis.call('ZREM', t .. ':queue', member) end
    redis.call('HDEL', t .. ':tickets', ticket, '>' .. ticket, '+' .. ticket, '@' .. ticket)
    redis.call('ZREM', t .. ':expiry', ticket)
    -- The last ticket gone, the rounds start again (as the memory store's queue forgets its flows).
    if member and redis.call('ZCARD', t .. ':queue') == 0 then redis.call('DEL', t .. ':flows') end
  end

  -- Removes the tickets whose lease ended; how many.
  local function expire_tickets(key)
    if key.expired then return 0 end
    key.expired = true
    local t = tag_of(key)
    local gone, n = redis.call('ZRANGEBYSCORE', t .. ':expiry', '-inf', string.format('%d', now)), 0
    for _, ticket in ipairs(gone) do
      local member = redis.call('HGET', t .. ':tickets', ticket)
      if member == GIVEN_UP then member = nil else n = n + 1 end
      drop_ticket(t, ticket, member)
    end
    tickets_expired = tickets_expired + n
    return n
  end

  local leave -- (below)

  -- A ticket handed the slot (its admission registered: one key, no floors): its lease recorded under
  -- its id with a token of its own (by key.admit(key, id, lease_ms) where the key's layout has its own:
  -- dify.lua's, token 0), the ticket out of the queue; what its process is told
  -- ('token:expires_at_ms:limit:in_flight'), or nil when it did not register or does not fit its limit.
  local function hand_off(key, t, ticket)
    local terms = redis.call('HMGET', t .. ':tickets', '>' .. ticket, '+' .. ticket, '@' .. ticket)
    if not terms[1] then return nil end
    local label = terms[3] and string.match(terms[3], '^%d+ %d+ (.*)$')
    local weight, lease_ms, d, m = string.match(terms[2], '^(%d+) (%d+) (%d+) (%d+)$')
    weight, lease_ms = tonumber(weight), tonumber(lease_ms)
    local limit = resolve(override(key), tonumber(d), tonumber(m))
    if limit == 0 or in_flight(key) + weight > limit then return nil end
    local token = key.admit and key.admit(key, terms[1], lease_ms)
    if not token then
      token = next_token({key}, 1)
      put(key, terms[1], weight, lease_ms, token, false)
      local flow_length = label and tonumber(string.match(terms[3], '^%d+ (%d+)'))
      label = label and string.sub(label, flow_length + 1)
      if label and label ~= '' then
        redis.call('HSET', key.permits, HOLDER .. terms[1], string.format('%d', now) .. ' ' .. label)
      end
    end
    leave(key, ticket, 0, true)
    return string.format('%d:%d:%d:%d', token, now + lease_ms, limit, in_flight(key))
  end

  -- The processes of the tickets at the head that fit in `room` slots (the head's at least) hear their
  -- turn, on their channel ('<n> <n2> ...'); with `hand`, the front ones that registered their
  -- admission are handed the slot instead ('<n>=<token>:<expires_at_ms>:<limit>:<in_flight>'), up to
  -- the first that did not (it asks, and those behind it with it).
  local function call_turns(key, room, hand)
    local t = tag_of(key)
    local head = redis.call('ZRANGE', t .. ':queue', 0, math.max(math.min(room, SCAN), 1) - 1)
    local by, order, used = {}, {}, 0
    for i, member in ipairs(head) do
      local w, ticket = parse_member(member)
      used = used + w
      if i > 1 and used > room then break end
      local handed = hand and hand_off(key, t, ticket) or nil
      hand = handed ~= nil
      local channel, n = string.match(ticket, '^(.*)#(%d+)$')
      if channel then
        if not by[channel] then by[channel], order[#order + 1] = {}, channel end
        table.insert(by[channel], handed and n .. '=' .. handed or n)
      end
    end
    for _, channel in ipairs(order) do redis.call('PUBLISH', channel, table.concat(by[channel], ' ')) end
  end

  -- After a release on a key with a queue, which leaves `count` slots in use: the tickets at the head that
  -- fit in the slots now free under the limit its waiters last met (at least the `weight` the release
  -- freed) are handed them, or hear their turn, so that several slots freed before their waiters ask go
  -- to as many waiters.
  local function call_after_release(key, count, weight)
    expire_tickets(key) -- (a dead head is not called)
    local limit = num(redis.call('HGET', tag_of(key) .. ':tickets', 'L'))
    call_turns(key, math.max(limit - count, weight), true)
  end

  -- Whether an admission of `weight` by `ticket` (false: one without) fits in `free` slots behind the
  -- tickets ahead of it (one without a ticket, or whose ticket is gone: behind all of them). A queue found
  -- empty is forgotten.
  local function in_turn(key, free, weight, ticket)
    expire_tickets(key)
    local scan = math.min(math.max(free, 0), SCAN) + 1
    local head = redis.call('ZRANGE', tag_of(key) .. ':queue', 0, scan - 1)
    if #head == 0 then
      redis.call('HDEL', key.permits, QUEUED)
      redis.call('DEL', tag_of(key) .. ':flows')
      key.queued = false
      return weight <= free
    end
    local ahead = 0
    for _, member in ipairs(head) do
      local w, owner = parse_member(member)
      if owner == ticket then return ahead + weight <= free end
      ahead = ahead + w
      if ahead + weight > free then return false end
    end
    return #head < scan and ahead + weight <= free -- (the whole queue seen)
  end

  -- At the bound of flows: forgets the flows whose next round is at most the one after the round their
  -- level serves (those that have waited or wait no further than that). One that comes back starts at the
  -- served round: at most one turn more than its share, only while a key has this many flows. How many
  -- entries are left.
  local function prune_flows(t)
    local flows, served, stale = t .. ':flows', {}, {}
    local all = redis.call('HGETALL', flows)
    for i = 1, #all, 2 do
      if not string.find(all[i], ' ', 1, true) then served[all[i]] = tonumber(all[i + 1]) end
    end
    for i = 1, #all, 2 do
      local level = string.match(all[i], '^(%d+) ')
      if level and math.floor(tonumber(all[i + 1]) / FLOW_STEP) <= (served[level] or 0) + 1 then
      stale[#stale + 1] = all[i]
    end
    end
    for _, field in ipairs(stale) do redis.call('HDEL', flows, field) end
    return redis.call('HLEN', flows)
  end

  -- The ticket's lease renewed, or a ticket taken at the end of the first round of its level in which
  -- its flow has taken fewer tickets than its weight; `limit`, the key's limit as the refusal found it,
  -- is kept with a new ticket (T:tickets 'L') for releases, which know none. 1: it holds a ticket; 0:
  -- the queue (or its flows) are at their bound, nothing taken.
  local function take_ticket(key, w, limit)
    local ticket, weight, level, flow, ticket_ms = w.ticket, w.weight, w.level, w.flow, w.ms
    local t = tag_of(key)
    expire_tickets(key) -- (a place whose lease ended is lost, also to its own waiter asking late)
    local deadline = string.format('%d', now + ticket_ms)
    local keep_ms = ticket_ms * 2 + 1000
    local kept = redis.call('HGET', t .. ':tickets', ticket)
    if kept == GIVEN_UP then return 1 end -- (an ask that came after its leave takes no place)
    if kept then -- its registered admission as this ask has it (a new limit, floors; of its place's weight)
      if w.id and parse_member(kept) == weight then
        redis.call('HSET', t .. ':tickets', '>' .. ticket, w.id, '+' .. ticket, w.terms)
      else
        redis.call('HDEL', t .. ':tickets', '>' .. ticket, '+' .. ticket)
      end
    else
      if redis.call('ZCARD', t .. ':queue') >= MAX_TICKETS then return 0 end
      local field = level .. ' ' .. flow
      local rounds = redis.call('HMGET', t .. ':flows', level, field)
      if not rounds[2] and redis.call('HLEN', t .. ':flows') >= MAX_FLOWS and prune_flows(t) >= MAX_FLOWS then
        return 0
      end
      local entry = num(rounds[2])
      local next, used = math.floor(entry / FLOW_STEP), entry % FLOW_STEP
      local round = math.max(num(rounds[1]), next)
      if round > next then used = 0 end
      used = used + 1
      local entry = used >= w.flow_weight and (round + 1) * FLOW_STEP or round * FLOW_STEP + used
      redis.call('HSET', t .. ':flows', field, string.format('%d', entry))
      local n = redis.call('HINCRBY', t .. ':tickets', '', 1)
      local member = string.format('%02x%010x%010x %d %s', 255 - level, round, n, weight, ticket)
      redis.call('ZADD', t .. ':queue', 0, member)
      local info = string.format('%d %d ', now, #flow) .. flow .. (w.label or '')
      if w.id then -- its admission registered, for a release to hand it the slot (hand_off)
        redis.call('HSET', t .. ':tickets', ticket, member, 'L', limit, '>' .. ticket, w.id, '+' .. ticket, w.terms,
          '@' .. ticket, info)
      else
        redis.call('HSET', t .. ':tickets', ticket, member, 'L', limit, '@' .. ticket, info)
      end
      if not key.queued then
        redis.call('HSET', key.permits, QUEUED, 1)
        key.queued, key.dirty = true, true -- (write_tokens() gives a hash made here its expiry)
      end
    end
    redis.call('ZADD', t .. ':expiry', deadline, ticket)
    -- Renewals keep the whole queue (a wait outlasts the first ticket's keep_ms): all four together,
    -- once the expiry they last gave has run down by a few seconds (a renewal comes every second).
    if redis.call('PTTL', t .. ':queue') < keep_ms - 3000 then
      for _, role in ipairs({':queue', ':tickets', ':flows', ':expiry'}) do redis.call('PEXPIRE', t .. role, keep_ms) end
    end
    return 1
  end

  -- The ticket leaves the key's queue (`admitted`, or given up); when it was the head, the tickets next
  -- that fit in `room` slots hear their turn (none when 0). Whether it was there.
  function leave(key, ticket, room, admitted)
    local t = tag_of(key)
    local member = redis.call('HGET', t .. ':tickets', ticket)
    if not member or member == GIVEN_UP then return false end
    local head = redis.call('ZRANGE', t .. ':queue', 0, 0)
    drop_ticket(t, ticket, member)
    -- Served: the level's round moves on to an admitted ticket's (later tickets of any flow start there).
    if admitted then
      local level = 255 - tonumber(string.sub(member, 1, 2), 16)
      local round = tonumber(string.sub(member, 3, 12), 16)
      local flows = t .. ':flows'
      if num(redis.call('HGET', flows, level)) < round then redis.call('HSET', flows, level, round) end
    end
    if head[1] == member and room > 0 then call_turns(key, room) end
    return true
  end

  -- The waiter of `ticket` gives it up (a leave record): it leaves, and stays given up for GIVEN_UP_MS
  -- (take_ticket then takes nothing). Whether it was in the queue.
  local function give_up(key, ticket)
    expire_tickets(key) -- (a ticket whose lease ended is no longer there: dropped first, as any call drops it)
    local left, t = leave(key, ticket, 1, false), tag_of(key)
    redis.call('HSET', t .. ':tickets', ticket, GIVEN_UP)
    redis.call('ZADD', t .. ':expiry', string.format('%d', now + GIVEN_UP_MS), ticket)
    for _, role in ipairs({':tickets', ':expiry'}) do
      if redis.call('PTTL', t .. role) < GIVEN_UP_MS then redis.call('PEXPIRE', t .. role, GIVEN_UP_MS) end
    end
    return left
  end

  -- Floors (the rule is Floors::reserved in crates/inflight/src/floors.rs): while a priority level with
  -- a floor has holders or waiters on a key and holds less than its floor, admissions of lower levels
  -- leave the difference free. A level's holders: T:held:<level>, a sorted set of the ids of the leases
  -- admitted at the level (where it has a floor), scored by weight; an entry whose lease is gone (released,
  -- expired) is dropped when counted. Renewals do not touch it: it lives HELD_MS from the last admission
  -- or count that found it in use.
  local HELD_MS = 90000000 -- 25 h: longer than any lease between two renewals (MAX_LEASE, 24 h)
  local function held_at(key, level)
    local set = tag_of(key) .. ':held:' .. level
    local held = 0
    local members = redis.call('ZRANGE', set, 0, -1, 'WITHSCORES')
    for i = 1, #members, 2 do
      local deadline = redis.call('ZSCORE', key.leases, members[i])
      if deadline and tonumber(deadline) > now then held = held + tonumber(members[i + 1])
      else redis.call('ZREM', set, members[i]) end
    end
    if held > 0 then redis.call('PEXPIRE', set, HELD_MS) end
    return held
  end

  local function waiting_at(key, level)
    if not key.queued then return false end
    expire_tickets(key)
    local pp = string.format('%02x', 255 - level)
    return #redis.call('ZRANGEBYLEX', tag_of(key) .. ':queue', '[' .. pp, '(' .. pp .. 'g', 'LIMIT', 0, 1) > 0
  end

  -- The slots an admission at `level` leaves free on the key, for the higher levels of `floors`
  -- ({{level, slots}, ...}).
  local function reserved(key, level, floors)
    local r = 0
    for _, floor in ipairs(floors) do
      if floor[1] > level then
        local held = held_at(key, floor[1])
        if held < floor[2] and (held > 0 or waiting_at(key, floor[1])) then r = r + floor[2] - held end
      end
    end
    return r
  end

  -- A lease admitted at a level with a floor is counted there (once: an id admitted again is scored anew).
  local function hold_at(key, level, floors, id, weight)
    for _, floor in ipairs(floors) do
      if floor[1] == level then
        local set = tag_of(key) .. ':held:' .. level
        redis.call('ZADD', set, weight, id)
        redis.call('PEXPIRE', set, HELD_MS)
      end
    end
  end

  made_queue = {expire_tickets = expire_tickets, call_turns = call_turns, call_after_release = call_after_release,
    in_turn = in_turn, take_ticket = take_ticket, leave = leave, give_up = give_up, reserved = reserved,
    hold_at = hold_at}
  return made_queue
end
