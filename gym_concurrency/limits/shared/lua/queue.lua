-- After state.lua and flows.lua, before every script's own part: the limit's clock, grace
-- periods, a lost state restored, leases, the queue and its hand-over (`grant`), and
-- `answer()`, which writes the state once and answers the common head.
-- The limit's clock (ms): Redis's time, except that a gap between two script calls counts
-- for at most a third of a lease. Live processes call at least that often (their
-- heartbeats), so a longer gap is time Redis was stopped (SIGSTOP, a VM paused) or could
-- not be reached: no lease expires for it, and its owners get a lease to renew.
local now = real
local v, last = tonumber(c[1]), tonumber(c[2])
if v and last then now = v + math.min(math.max(0, real - last), math.floor(TTL / 3)) end

-- A grace period of `ms`: nothing is granted while live processes re-register.
local function start_grace(ms)
  S.grace = math.max(S.grace, real + ms)
end
local function in_grace()
  return S.grace > real
end

-- In a Redis Cluster, the node that wrote the state last (`id`, CLUSTER MYID): a script on
-- another node (a replica promoted with its copy: its last writes may be missing) starts
-- the grace CHECK_SERVER starts for a new connection. A connection does not run that check
-- again when its node changes role: one made while its node was the slot's primary before
-- (or a replica: the check answered MOVED) stays in the client's pool, and may be the first
-- to reach the node once it is promoted.
if CLUSTER then
  local me = redis.call('CLUSTER', 'MYID')
  if S.node ~= me then
    if S.node ~= '' then
      start_grace(TTL)
      S.run = string.match(redis.call('INFO', 'server'), 'run_id:(%w+)')
    end
    S.node = me
  end
end

-- The counts are gone with the state (lost, or the limit's first call): counted again from
-- the keys. With the size still known, the state was lost under the limit (an eviction, a
-- DEL; or written by an older version): a grace period.
if S.held == nil then
  S.held, S.leases = weight_of(K_LEASES)
  S.queued_weight, S.queued = weight_of(K_QUEUE)
  local last_ticket = redis.call('ZRANGE', K_QUEUE, -1, -1, 'WITHSCORES')
  if #last_ticket == 2 then S.seq = tonumber(last_ticket[2]) end
  S.earliest = 0
  if S.limit == nil then S.limit = tonumber(redis.call('GET', K_LIMIT)) end
  if S.limit ~= nil then start_grace(TTL) end
  reflow()
end

-- The state is missing. How long to hand out nothing while live processes re-register what
-- they hold (ms; 0: nothing can be held): a lease if this process saw the state before, or
-- if this Redis was promoted from a replica (a failover); if Redis started less than two
-- seconds ago (a restart without persistence, found first by a process that never talked
-- to it), until the processes that held slots are back: they try again every quarter
-- second at most, and the first of them to come back finds the state restored and
-- re-registers its leases. Else this is the limit's first start on a Redis that has been up.
local function lost()
  if CONTACTED then return TTL end
  local server = redis.call('INFO', 'server')
  local up = tonumber(string.match(server, 'uptime_in_seconds:(%d+)')) or 0
  local young = math.min(TTL, math.max(2000, math.floor(TTL / 3) + 500))
  if up * 1000 < young then return young end
  local replication = redis.call('INFO', 'replication')
  if (tonumber(string.match(replication, 'second_repl_offset:(-?%d+)')) or -1) >= 0 then
    return TTL
  end
  return 0
end

local function set_limit(size)
  redis.call('SET', K_LIMIT, size)
  S.limit = size
end

-- Set `size` on a missing state; if it was lost, a grace period (see `lost`).
local function restore(size)
  set_limit(size)
  local grace = lost()
  if grace > 0 then start_grace(grace) end
end

-- The global size, restored from the one this process last saw if it is gone.
local function current_limit()
  if S.limit == nil then restore(tonumber(ARGV[3])) end
  return S.limit
end

local function member()
  redis.call('ZADD', K_MEMBERS, now + TTL, PROC)
end

local function add_lease(id, deadline)
  local added = redis.call('ZADD', K_LEASES, deadline, id)
  if added == 1 and (S.leases == 0 or deadline < S.earliest) then S.earliest = deadline end
  S.leases = S.leases + added
  if added == 1 then held_change(id, weight(id)) end
  return added == 1
end

-- Drop leases whose process stopped renewing them, once one may have (`e`): a lease that
-- expires takes its notification back if its process never read it (a process cut off
-- must not be told of a slot that has gone to someone else meanwhile).
local function reap_leases()
  if S.leases == 0 or now < S.earliest then return end
  while true do
    local dead = redis.call('ZRANGEBYSCORE', K_LEASES, '-inf', now, 'LIMIT', 0, 500)
    if #dead == 0 then break end
    for _, id in ipairs(dead) do
      redis.call('LREM', MBOX .. string.match(id, '^[^:]+'), 0, id)
      held_change(id, -weight(id))
      forget_cap(id)
    end
    S.leases = S.leases - redis.call('ZREM', K_LEASES, unpack(dead))
  end
  local first = redis.call('ZRANGE', K_LEASES, 0, 0, 'WITHSCORES')
  S.earliest = #first == 2 and tonumber(first[2]) or 0
end

-- Waiter `id` leaves the queue (admitted, or gone); 1 if it was there. `ticket` if known;
-- `later` as for `flow_unqueue`.
local function unqueue(id, ticket, later)
  ticket = ticket or (S.fw > 0 and redis.call('ZSCORE', K_QUEUE, id))
  if redis.call('ZREM', K_QUEUE, id) == 0 then return 0 end
  S.queued, S.queued_weight = S.queued - 1, S.queued_weight - weight(id)
  if ticket then flow_unqueue(id, ticket, later) end
  return 1
end

-- Drop waiters and members whose process stopped renewing them (the heartbeat's scripts:
-- a dead process's waiter at the head of the queue is skipped by `grant` meanwhile).
local function reap_waiters()
  redis.call('ZREMRANGEBYSCORE', K_MEMBERS, '-inf', now)
  while true do
    local dead = redis.call('ZRANGEBYSCORE', K_WEXP, '-inf', now, 'LIMIT', 0, 500)
    if #dead == 0 then break end
    for _, id in ipairs(dead) do unqueue(id) end
    redis.call('ZREM', K_WEXP, unpack(dead))
  end
end

-- The waiter chosen next in flow mode, taken out of the queue if its weight fits (nil, and
-- kept as chosen, if not; nil, leaving flow mode, if the flows' keys hold nobody). The
-- flows' keys naming a waiter `queue` no longer has (one of them, or `queue`, was lost)
-- are rebuilt, and the choice made again.
local function flow_take()
  for _ = 1, 2 do
    local id, ticket = flow_next()
    if id == nil then
      reflow()
      if S.fw == 0 then return nil end
      id, ticket = flow_next()
      if id == nil then return nil end
    end
    if S.held + fitted(id) > S.limit or budget_wait(id, true) > 0 then
      S.chosen = id
      return nil
    end
    -- (its lease, or `rescore`, puts its flow's next head in)
    if unqueue(id, ticket, true) == 1 then return id end
    reflow()
    if S.fw == 0 then return nil end
  end
  return nil
end

-- The head of `id`'s flow into `ready`, if it waits (after a waiter taken `later` got no
-- lease: its process had stopped).
local function rescore(id)
  if S.fw == 0 then return end
  local flow = flow_of(id)
  local head = head_of(flow)
  if head then ready(held_by(flow), head) end
end

-- Waiter `id`, out of the queue, gets its lease: it keeps the waiter's deadline (its process
-- renews it from then on), and the waiter's process is told through its mailbox.
local function hand(id)
  local deadline, leased = tonumber(redis.call('ZSCORE', K_WEXP, id)), false
  if deadline then
    redis.call('ZREM', K_WEXP, id)
    if deadline >= now then
      local lease = capped_lease(id)
      leased = add_lease(lease, deadline)
      if leased then budget_charge(id, true) end
      redis.call('RPUSH', MBOX .. string.match(id, '^[^:]+'), lease)
    end
  end
  if not leased then rescore(id) end
end

-- The budgets alone hold back `head`, the oldest waiter (first-come order): a waiter behind
-- it (of the first PASS_SCAN) is admitted past it, oldest first, if it fits the budgets now
-- and leaves `head` its slots now and its budgets at its target (`budget_room`): `head` is
-- admitted no later than that. (PASSING: a waiter queued in this call may pass too.)
local PASSING = false
local function pass_by(head)
  local room = budget_room(head)
  if not room then return end
  PASSING = true
  for _, id in ipairs(redis.call('ZRANGE', K_QUEUE, 1, PASS_SCAN)) do
    if S.held + fitted(head) + fitted(id) <= S.limit and budget_passes(id, room) then
      unqueue(id)
      hand(id)
    end
  end
end

-- Hand free capacity to the oldest waiters (`hand`). Nothing while a grace period lasts;
-- the oldest waiter is never passed: capacity that frees is kept for it until its weight
-- fits (at most the limit: see `fitted`); only while the budgets alone hold it back, with a
-- backfill, lighter waiters may use what it cannot until its target (`pass_by`).
local function grant()
  if in_grace() then return end
  while S.held < S.limit and S.queued > 0 do
    local before = S.queued
    local id = S.fw > 0 and flow_take()
    if not id then
      if S.fw > 0 then return end  -- (the one chosen does not fit)
      local head = redis.call('ZPOPMIN', K_QUEUE)
      if #head == 0 then S.queued, S.queued_weight = 0, 0 return end  -- (the queue key lost)
      id = head[1]
      local slots_fit = S.held + fitted(id) <= S.limit
      if not slots_fit or budget_wait(id, true) > 0 then
        redis.call('ZADD', K_QUEUE, head[2], id)  -- (back at its place, first)
        S.chosen = id
        if slots_fit then pass_by(id) end
        return
      end
      S.queued, S.queued_weight = S.queued - 1, S.queued_weight - weight(id)
    end
    hand(id)
    if S.queued >= before then return end  -- (no waiter left the queue: stop, never spin)
  end
end

-- Queue `id` with the next ticket; one queued already (a call run twice: a reply lost and
-- the call sent again; a renewal re-queueing it) keeps its ticket.
local function enqueue(id)
  local added = redis.call('ZADD', K_QUEUE, 'NX', S.seq + 1, id)
  S.seq = S.seq + added
  S.queued, S.queued_weight = S.queued + added, S.queued_weight + added * weight(id)
  redis.call('ZADD', K_WEXP, now + TTL, id)
  if added == 1 then flow_enqueue(id, S.seq) end
end

local function remove(id)
  if redis.call('ZREM', K_LEASES, id) == 1 then
    S.leases = S.leases - 1
    held_change(id, -weight(id))
    forget_cap(id)
    return
  end
  if unqueue(id) == 0 then  -- (granted a capped lease its process has not heard of yet?)
    local lease = redis.call('HGET', K_CAPPED, id)
    if lease then remove(lease) end
  end
  redis.call('ZREM', K_WEXP, id)
end

-- Write the state once, and answer {status, limit, held, queued, stamp, expiry, queued
-- weight, flows, budgets, ...} (held and queued weight in weight units, queued in waiters;
-- budgets: see `budget_save`, "" without): the
-- stamp (Redis's µs; scripts run one at a time) lets a client ignore an older answer that
-- reaches it after a newer one; expiry is the milliseconds until a lease may expire or the
-- grace period ends or the waiter chosen next fits the budgets (-1: none of them), when a
-- process with waiters checks again.
local function answer(status, ...)
  if S.queued == 0 then S.seq = 0 end  -- (tickets restart from anything)
  if S.run == false then
    S.run = string.match(redis.call('INFO', 'server'), 'run_id:(%w+)')
  end
  local kept, said, blocked = budget_save()
  redis.call('HSET', K_STATE, 'v', now, 't', real, 'l', S.limit, 'n', S.held,
    'q', S.queued, 's', S.seq, 'e', S.earliest, 'g', S.grace, 'run', S.run,
    'c', S.leases, 'w', S.queued_weight, 'fw', S.fw, 'fh', S.fh, 'f0', S.t0, 'x', S.chosen,
    'fn', S.nf, 'b', kept or S.budget or '', 'id', S.node)
  local expiry = -1
  if S.leases > 0 then expiry = math.max(0, S.earliest - now) end
  local grace = S.grace - real
  if grace > 0 and (expiry < 0 or grace < expiry) then expiry = grace end
  if blocked and blocked >= 0 and (expiry < 0 or blocked < expiry) then expiry = blocked end
  local stamp = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local flows = S.fw > 0 and S.nf or math.min(S.queued, 1)
  local out = {status, S.limit, S.held, S.queued, stamp, expiry, S.queued_weight, flows, said}
  for _, value in ipairs({...}) do out[#out + 1] = value end
  return out
end
