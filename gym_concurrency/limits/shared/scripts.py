"""The Lua scripts of a limit shared across processes (`SharedLimit`): each step is atomic in
Redis (or Valkey), reads the limit's state once and writes it once, and keeps time with the
limit's own clock (Redis `TIME`, never a client's, less the time Redis was stopped).

Keys, all under one hash tag so that they live in one cluster slot (`KEYS` order):

1. `limit`       the global number of slots (string): the size, kept while processes come
                 and go (the state's `l` is the copy every script reads)
2. `queue`       ZSET waiter id -> ticket: the global queue, oldest first
3. `wexp`        ZSET waiter id -> deadline (clock ms): a waiter whose process stops renewing
                 it is dropped, so a dead process never blocks the queue
4. `leases`      ZSET lease id -> deadline (clock ms): the weight held now, a lease each
                 admission
5. `configured`  the size processes start with (a runtime resize does not change it)
6. `state`       HASH, read once (HMGET) and written once (HSET) by every script:
                 v, t  the limit's clock (ms) and Redis's time (ms) at the last call
                 l     the limit; n, w  the weight held and queued (what every decision
                       reads: never a ZCARD on the admission path); c, q  the leases and
                       waiters (ZCARD of `leases` and `queue`, as a renewal checks)
                 s     the last ticket; e  no lease expires before this (clock ms)
                 g     until when (Redis's ms) a grace period lasts
                 run   the run id of the Redis that keeps the state (see `CHECK_SERVER`)
7. `members`     ZSET process id -> deadline (clock ms): the processes alive on this limit
8. `mbox:<proc>` LIST of lease ids granted to process `<proc>` (its waiters are woken by
                 BLPOP); the key is the common `ARGV[1]` prefix plus the process id

`limit`, `configured` and `state` stay once made; the others are gone once nothing is held,
queued or alive. A key lost on its own (evicted under an allkeys-* `maxmemory-policy`, or
deleted) never admits more than the limit: the counts live in `state`, so losing `leases`
or `queue` changes no decision, and the next renewal (any process's, a third of a lease at
most) finds the keys disagree with them and starts a grace period; `state` lost (its `n`
missing while the size is known) starts one at once. A grace period hands out nothing
while live processes re-register what they hold.

Ids are `<proc>:<n>`, or `<proc>:<n>*<w>` for a weight w other than 1, and never sent twice:
a waiter that is handed a slot keeps its id as the lease id, the process part names the
mailbox to notify, and the weight rides along (no lookup). FIFO by ticket with weights: the
oldest waiter is never passed; capacity that frees is kept for it until its weight fits.

Every script takes the same first five arguments: mailbox prefix, lease milliseconds, the
limit as last seen (restored if the state is gone), this process's id, and "1" if this
process has seen the limit's state before (so that its absence means Redis lost it).
Every script answers `{status, limit, weight held, waiters queued, stamp, expiry, weight
queued, ...}`: Redis's time in microseconds, and milliseconds until a lease may expire or
the grace period ends (-1: neither).

Commands per call, on the admission path: an admission 4 (TIME, HMGET, ZADD, HSET), a
release 4, a waiter queued 5, a release that hands its slot on 9.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "ACQUIRE", "CHECK_SERVER", "CONFIGURE", "CONFLICT", "KEY_NAMES", "LEAVE", "REMOVE", "SYNC",
]  # fmt: skip

KEY_NAMES: Final = ("limit", "queue", "wexp", "leases", "configured", "state", "members")

CONFLICT: Final = 3  # CONFIGURE's status: live processes hold another size for this limit

_PRELUDE: Final = """
local K_LIMIT, K_QUEUE, K_WEXP, K_LEASES, K_CONFIGURED, K_STATE, K_MEMBERS =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local MBOX, TTL, PROC, CONTACTED = ARGV[1], tonumber(ARGV[2]), ARGV[4], ARGV[5] == '1'
local t = redis.call('TIME')
local real = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- The state (see the module's docstring), read once.
local c = redis.call('HMGET', K_STATE, 'v', 't', 'l', 'n', 'q', 's', 'e', 'g', 'run', 'c', 'w')
local S = {
  limit = tonumber(c[3]), held = tonumber(c[4]), queued = tonumber(c[5]) or 0,
  seq = tonumber(c[6]) or 0, earliest = tonumber(c[7]) or 0, grace = tonumber(c[8]) or 0,
  run = c[9], leases = tonumber(c[10]) or 0, queued_weight = tonumber(c[11]) or 0,
}

-- A lease's (or waiter's) weight rides in its id: `<proc>:<n>` weighs 1, `<proc>:<n>*<w>` w.
local function weight(id)
  return tonumber(string.match(id, '%*(%d+)$')) or 1
end
local function weight_of(key)
  local total, ids = 0, redis.call('ZRANGE', key, 0, -1)
  for _, id in ipairs(ids) do total = total + weight(id) end
  return total, #ids
end

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
  S.held = S.held + added * weight(id)
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
      S.held = S.held - weight(id)
    end
    S.leases = S.leases - redis.call('ZREM', K_LEASES, unpack(dead))
  end
  local first = redis.call('ZRANGE', K_LEASES, 0, 0, 'WITHSCORES')
  S.earliest = #first == 2 and tonumber(first[2]) or 0
end

-- Drop waiters and members whose process stopped renewing them (the heartbeat's scripts:
-- a dead process's waiter at the head of the queue is skipped by `grant` meanwhile).
local function reap_waiters()
  redis.call('ZREMRANGEBYSCORE', K_MEMBERS, '-inf', now)
  while true do
    local dead = redis.call('ZRANGEBYSCORE', K_WEXP, '-inf', now, 'LIMIT', 0, 500)
    if #dead == 0 then break end
    for _, id in ipairs(dead) do
      local gone = redis.call('ZREM', K_QUEUE, id)
      S.queued, S.queued_weight = S.queued - gone, S.queued_weight - gone * weight(id)
    end
    redis.call('ZREM', K_WEXP, unpack(dead))
  end
end

-- Hand free capacity to the oldest waiters: the lease keeps the waiter's deadline (its
-- process renews it from then on) and the waiter's process is told through its mailbox.
-- Nothing while a grace period lasts; the oldest waiter is never passed: capacity that
-- frees is kept for it until its weight fits.
local function grant()
  if in_grace() then return end
  while S.held < S.limit and S.queued > 0 do
    local head = redis.call('ZPOPMIN', K_QUEUE)
    if #head == 0 then S.queued, S.queued_weight = 0, 0 return end  -- (the queue key lost)
    local id = head[1]
    local w = weight(id)
    if S.held + w > S.limit then
      redis.call('ZADD', K_QUEUE, head[2], id)  -- (back at its place, first)
      return
    end
    S.queued, S.queued_weight = S.queued - 1, S.queued_weight - w
    local deadline = tonumber(redis.call('ZSCORE', K_WEXP, id))
    if deadline then
      redis.call('ZREM', K_WEXP, id)
      if deadline >= now then
        add_lease(id, deadline)
        redis.call('RPUSH', MBOX .. string.match(id, '^[^:]+'), id)
      end
    end
  end
end

local function enqueue(id)
  S.seq = S.seq + 1
  local added = redis.call('ZADD', K_QUEUE, S.seq, id)
  S.queued, S.queued_weight = S.queued + added, S.queued_weight + added * weight(id)
  redis.call('ZADD', K_WEXP, now + TTL, id)
end

local function remove(id)
  if redis.call('ZREM', K_LEASES, id) == 1 then
    S.leases, S.held = S.leases - 1, S.held - weight(id)
    return
  end
  local gone = redis.call('ZREM', K_QUEUE, id)
  S.queued, S.queued_weight = S.queued - gone, S.queued_weight - gone * weight(id)
  redis.call('ZREM', K_WEXP, id)
end

-- Write the state once, and answer {status, limit, held, queued, stamp, expiry, queued
-- weight, ...} (held and queued weight in weight units, queued in waiters): the
-- stamp (Redis's µs; scripts run one at a time) lets a client ignore an older answer that
-- reaches it after a newer one; expiry is the milliseconds until a lease may expire or the
-- grace period ends (-1: neither), when a process with waiters checks again.
local function answer(status, ...)
  if S.queued == 0 then S.seq = 0 end  -- (tickets restart from anything)
  if S.run == false then
    S.run = string.match(redis.call('INFO', 'server'), 'run_id:(%w+)')
  end
  redis.call('HSET', K_STATE, 'v', now, 't', real, 'l', S.limit, 'n', S.held,
    'q', S.queued, 's', S.seq, 'e', S.earliest, 'g', S.grace, 'run', S.run,
    'c', S.leases, 'w', S.queued_weight)
  local expiry = -1
  if S.leases > 0 then expiry = math.max(0, S.earliest - now) end
  local grace = S.grace - real
  if grace > 0 and (expiry < 0 or grace < expiry) then expiry = grace end
  local stamp = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local out = {status, S.limit, S.held, S.queued, stamp, expiry, S.queued_weight}
  for _, value in ipairs({...}) do out[#out + 1] = value end
  return out
end
"""

# ARGV[6] max_queue (-1: unbounded), ARGV[7...] new waiter ids in this process's arrival
# order. Each is admitted at once if nobody queues, no grace period runs and a slot is free,
# shed if max_queue already wait, else queued with the next ticket. Answers {0, limit,
# held, queued, stamp, expiry, queued weight, statuses}: a status per id, 0 queued, 1
# admitted (its weight fit), 2 shed.
ACQUIRE: Final = (
    _PRELUDE
    + """
current_limit()
reap_leases()
grant()
local max_queue = tonumber(ARGV[6])
local statuses = {}
for i = 7, #ARGV do
  local id = ARGV[i]
  local status = 0
  if S.queued == 0 and not in_grace() and S.held + weight(id) <= S.limit then
    add_lease(id, now + TTL)
    status = 1
  elseif max_queue >= 0 and S.queued >= max_queue then
    status = 2
  else
    enqueue(id)
  end
  statuses[#statuses + 1] = status
end
return answer(0, statuses)
"""
)

# ARGV[6...] ids: leases given back, waiters that left, anything to drop. Frees their slots
# to the oldest waiters. Answers the common head (see `answer`). Idempotent.
REMOVE: Final = (
    _PRELUDE
    + """
current_limit()
for i = 6, #ARGV do remove(ARGV[i]) end
reap_leases()
grant()
return answer(0)
"""
)

# A process closes: as REMOVE for ARGV[6...], and the process leaves the members and drops
# its mailbox. Answers the common head.
LEAVE: Final = (
    _PRELUDE
    + """
current_limit()
for i = 6, #ARGV do remove(ARGV[i]) end
redis.call('ZREM', K_MEMBERS, PROC)
redis.call('DEL', MBOX .. PROC)
reap_leases()
grant()
return answer(0)
"""
)

# The heartbeat and re-check of one process. ARGV[6] = n held lease ids, then those ids;
# then m queued waiter ids (count first), then ids to drop (the rest). It also checks the
# state's counts against the keys: fewer leases than counted means the leases key was lost
# (a grace period); the counts are set to the keys'. Drops come first. Held leases are
# renewed, and re-registered if Redis lost them or they expired: the work is still running,
# and counts before anything is granted, over the limit too (a process cut off that comes
# back, a local fallback's slots): Redis then grants nothing until the work drains, where
# leaving it out would hand the same slots out twice. Queued waiters are renewed, reported
# if they were handed a slot, re-queued at the back if Redis lost them (or lost the queue).
# Answers the common head, then granted ids, re-registered ids, re-queued ids.
SYNC: Final = (
    _PRELUDE
    + """
current_limit()
if redis.call('EXISTS', K_LIMIT) == 0 then redis.call('SET', K_LIMIT, S.limit) end
local leases, queued = redis.call('ZCARD', K_LEASES), redis.call('ZCARD', K_QUEUE)
if leases ~= S.leases then  -- (fewer: the leases key was lost)
  if leases < S.leases then start_grace(TTL) end
  S.held, S.leases = weight_of(K_LEASES)
end
if queued ~= S.queued then S.queued_weight, S.queued = weight_of(K_QUEUE) end
if leases == 0 then S.earliest = 0 end
reap_waiters()
member()
reap_leases()
local n = tonumber(ARGV[6])
local held_from, queued_from = 7, 8 + n
local drops_from = queued_from + tonumber(ARGV[7 + n])
-- Drops first: a slot they free is one a lost lease may take back.
for j = drops_from, #ARGV do remove(ARGV[j]) end
local reclaimed, granted, requeued = {}, {}, {}
for j = held_from, queued_from - 2 do
  local id = ARGV[j]
  if redis.call('ZADD', K_LEASES, 'XX', 'CH', now + TTL, id) == 0
      and not redis.call('ZSCORE', K_LEASES, id) then
    add_lease(id, now + TTL)
    reclaimed[#reclaimed + 1] = id
  end
end
local queue_lost = S.queued < redis.call('ZCARD', K_WEXP)
for j = queued_from, drops_from - 1 do
  local id = ARGV[j]
  local waiting = redis.call('ZSCORE', K_WEXP, id)
  if waiting and not (queue_lost and not redis.call('ZSCORE', K_QUEUE, id)) then
    redis.call('ZADD', K_WEXP, now + TTL, id)
  elseif redis.call('ZSCORE', K_LEASES, id) then
    redis.call('ZADD', K_LEASES, now + TTL, id)
    granted[#granted + 1] = id
  else
    enqueue(id)
    requeued[#requeued + 1] = id
  end
end
grant()
return answer(0, granted, reclaimed, requeued)
"""
)

# ARGV[6] size, ARGV[7] "resize" (set it) or "configure" (a process starts with this size).
# A configured size is taken if the limit's state is missing (restored as above), if it is
# the size processes start with or the size in force (a process restarting keeps a runtime
# resize), or if no other process lives on the limit (a new configuration rolls out once
# the old one's processes are gone). Otherwise it disagrees with live processes: status
# CONFLICT, nothing changed. Growing hands the new slots to the oldest waiters at once;
# shrinking revokes nothing. Answers the common head, then the configured size or "", and
# the maxmemory-policy if a maxmemory is set or "".
CONFIGURE: Final = (
    _PRELUDE
    + """
reap_waiters()
local CONFLICT = 3
local size, kind = tonumber(ARGV[6]), ARGV[7]
local configured = tonumber(redis.call('GET', K_CONFIGURED))
local status = 0
if S.limit == nil then
  restore(size)
  if kind == 'configure' then redis.call('SET', K_CONFIGURED, size) end
elseif kind == 'resize' then
  set_limit(size)
elseif configured == nil then  -- (restored by a resize): the size in force stays
  redis.call('SET', K_CONFIGURED, size)
elseif size ~= configured and size ~= S.limit then
  local others = redis.call('ZCARD', K_MEMBERS)
  if redis.call('ZSCORE', K_MEMBERS, PROC) then others = others - 1 end
  if others > 0 then
    status = CONFLICT
  else
    set_limit(size)
    redis.call('SET', K_CONFIGURED, size)
  end
end
if status == 0 then member() end
reap_leases()
grant()
local memory = redis.call('INFO', 'memory')
local policy = ''
if (tonumber(string.match(memory, 'maxmemory:(%d+)')) or 0) > 0 then
  policy = string.match(memory, 'maxmemory_policy:([%w-]+)') or ''
end
return answer(status, tostring(configured or ''), policy)
"""
)

# Run on every new connection, before its first command. KEYS: `limit`, `state`; ARGV[1]
# lease milliseconds. If the limit's state was kept by another Redis than this one (a
# replica promoted by a failover, a snapshot restored: its last writes may be missing), hand
# out nothing for one lease while live processes re-register what they hold. Every process
# reconnects after a failover, so one of them finds it before any script runs there.
# Answers 1 if it started a grace period, 2 if the state is missing (a restart: the process
# renews at once, so that its holders count again soon), else 0.
CHECK_SERVER: Final = """
local run = string.match(redis.call('INFO', 'server'), 'run_id:(%w+)')
if redis.call('EXISTS', KEYS[1]) == 0 then return 2 end
local kept = redis.call('HGET', KEYS[2], 'run')
redis.call('HSET', KEYS[2], 'run', run)
if kept and kept ~= run then
  local t = redis.call('TIME')
  local real = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local until_ms = real + tonumber(ARGV[1])
  local grace = tonumber(redis.call('HGET', KEYS[2], 'g')) or 0
  redis.call('HSET', KEYS[2], 'g', math.max(grace, until_ms))
  return 1
end
return 0
"""
