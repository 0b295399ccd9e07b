"""The Lua scripts of a limit shared across processes (`SharedLimit`): each step is atomic in
Redis (or Valkey), reaps expired leases and waiters first, and keeps time with the limit's
own clock (Redis `TIME`, never a client's, less the time Redis was stopped; see `clock`).

Keys, all under one hash tag so that they live in one cluster slot (`KEYS` order):

1. `limit`       the global number of slots (string)
2. `seq`         the ticket counter (INCR): FIFO order across processes
3. `queue`       ZSET waiter id -> ticket: the global queue, oldest first
4. `wexp`        ZSET waiter id -> deadline (clock ms): a waiter whose process stops renewing
                 it is reaped, so a dead process never blocks the queue
5. `leases`      ZSET lease id -> deadline (clock ms): the slots held now, one lease each
6. `grace`       present for a while (a lease at most) after a script found the limit's
                 state lost (see `lost`, `damaged`) or kept by another Redis (see
                 `CHECK_SERVER`): no slot is handed out while live processes re-register
                 what they hold (mirrored in the clock's `g`, so losing one ends no grace)
7. `configured`  the size processes start with (a runtime resize does not change it)
8. `clock`       HASH {v, t, run, g}: the limit's clock (ms), Redis's time at the last
                 script call, the run id of the Redis that keeps the state (see
                 `CHECK_SERVER`) and until when (Redis's ms) a grace period lasts
9. `members`     ZSET process id -> deadline (clock ms): the processes alive on this limit
10. `tally`      the number of leases every script left (kept with the configuration): a
                 `leases` key that holds another number was lost (evicted under `maxmemory`,
                 or deleted) and starts a grace period (see `damaged`)
11. `mbox:<proc>` LIST of lease ids granted to process `<proc>` (its waiters are woken by
                 BLPOP); the key is the common `ARGV[1]` prefix plus the process id

`limit`, `configured` and `tally` are the limit's configuration and stay; every other key
is gone once no process holds, queues or lives on the limit (or expires: `grace`, mailboxes).

Ids are `<proc>:<n>`: a waiter that is handed a slot keeps its id as the lease id, and the
process part names the mailbox to notify. Every script takes the same first five arguments:
mailbox prefix, lease milliseconds, the limit as last seen (restored if the key is gone),
this process's id, and "1" if this process has seen the limit's state before (so that its
absence means Redis lost it). Every script answers `{status, limit, leases
held, waiters queued, stamp, expiry, ...}`: Redis's time in microseconds, and milliseconds
until the next lease expires or the grace period ends (-1: neither).
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "ACQUIRE", "CHECK_SERVER", "CONFIGURE", "CONFLICT", "KEY_NAMES", "LEAVE", "REMOVE", "SYNC",
]  # fmt: skip

KEY_NAMES: Final = (
    "limit", "seq", "queue", "wexp", "leases", "grace", "configured", "clock", "members",
    "tally",
)  # fmt: skip

CONFLICT: Final = 3  # CONFIGURE's status: live processes hold another size for this limit

_PRELUDE: Final = """
local K_LIMIT, K_SEQ, K_QUEUE, K_WEXP, K_LEASES, K_GRACE, K_CONFIGURED, K_CLOCK, K_MEMBERS =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local K_TALLY = KEYS[10]
local MBOX, TTL, PROC, CONTACTED = ARGV[1], tonumber(ARGV[2]), ARGV[4], ARGV[5] == '1'
local t = redis.call('TIME')
local real = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- The limit's clock (ms): Redis's time, except that a gap between two script calls counts
-- for at most a third of a lease. Live processes call at least that often (their
-- heartbeats), so a longer gap is time Redis was stopped (SIGSTOP, a VM paused) or could
-- not be reached: no lease expires for it, and its owners get a lease to renew.
local function clock()
  local c = redis.call('HMGET', K_CLOCK, 'v', 't')
  local v, last = tonumber(c[1]), tonumber(c[2])
  if v == nil or last == nil then return real, true end
  local gap = math.max(0, real - last)
  return v + math.min(gap, math.floor(TTL / 3)), false
end
local now, clock_gone = clock()

-- A grace period: the `grace` key and its mirror in the clock (`g`): either one lost (an
-- eviction, a DEL) ends no grace early. `grace_left()` is its milliseconds left (0: none).
local function start_grace(ms)
  redis.call('SET', K_GRACE, '1', 'PX', ms)
  redis.call('HSET', K_CLOCK, 'g', real + ms)
end
local function grace_left()
  local mirror = (tonumber(redis.call('HGET', K_CLOCK, 'g')) or 0) - real
  return math.max(0, redis.call('PTTL', K_GRACE), mirror)
end

-- One of the limit's keys lost on its own while its size stayed (evicted by an allkeys-*
-- `maxmemory-policy`, or deleted by an operator): another number of leases than the tally
-- every script leaves (the leases key lost), the tally lost (it lives as long as the size:
-- one grace, too, on a state an older version wrote), or the clock lost under leases (its
-- time would jump and expire them early). A lost size is `restore`'s to find.
local function damaged()
  if redis.call('EXISTS', K_LIMIT) == 0 then return false end
  local leases = redis.call('ZCARD', K_LEASES)
  local tally = tonumber(redis.call('GET', K_TALLY))
  return tally ~= leases or (clock_gone and leases > 0)
end
local found_damage = damaged()
redis.call('HSET', K_CLOCK, 'v', now, 't', real)
if found_damage then start_grace(TTL) end

-- Drop expired leases (their process stopped renewing them), waiters and members. A lease
-- that expires takes its notification back if its process never read it (a process cut
-- off must not be told of a slot that has gone to someone else meanwhile).
local function reap()
  while true do
    local dead = redis.call('ZRANGEBYSCORE', K_LEASES, '-inf', now, 'LIMIT', 0, 500)
    if #dead == 0 then break end
    for _, id in ipairs(dead) do
      redis.call('LREM', MBOX .. string.match(id, '^[^:]+'), 0, id)
    end
    redis.call('ZREM', K_LEASES, unpack(dead))
  end
  redis.call('ZREMRANGEBYSCORE', K_MEMBERS, '-inf', now)
  while true do
    local dead = redis.call('ZRANGEBYSCORE', K_WEXP, '-inf', now, 'LIMIT', 0, 500)
    if #dead == 0 then break end
    redis.call('ZREM', K_QUEUE, unpack(dead))
    redis.call('ZREM', K_WEXP, unpack(dead))
  end
end

-- The limit's state is missing. How long to hand out nothing while live processes
-- re-register what they hold (ms; 0: nothing can be held): a lease if this process saw the
-- state before, or if this Redis was promoted from a replica (a failover); if Redis started
-- less than two seconds ago (a restart without persistence, found first by a process that
-- never talked to it), until the processes that held slots are back: they try again every
-- quarter second at most, and the first of them to come back finds the state restored and
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

-- Set `size` on a missing state; if it was lost, a grace period (see `lost`).
local function restore(size)
  redis.call('SET', K_LIMIT, size)
  local grace = lost()
  if grace > 0 then start_grace(grace) end
end

-- The clock names the Redis that keeps the state (`CHECK_SERVER` compares it on every new
-- connection): set it once it is not.
if redis.call('HEXISTS', K_CLOCK, 'run') == 0 then
  redis.call('HSET', K_CLOCK, 'run', string.match(redis.call('INFO', 'server'), 'run_id:(%w+)'))
end

-- The global size, restored from the one this process last saw if it is gone.
local function current_limit()
  local limit = tonumber(redis.call('GET', K_LIMIT))
  if limit == nil then
    limit = tonumber(ARGV[3])
    restore(limit)
  end
  return limit
end

local function member()
  redis.call('ZADD', K_MEMBERS, now + TTL, PROC)
end

-- Hand free slots to the oldest waiters: the lease keeps the waiter's id and deadline (its
-- process renews it from then on) and the waiter's process is told through its mailbox.
-- Nothing while the grace period lasts, nothing while the leases fill the limit.
local function grant(limit)
  if grace_left() > 0 then return end
  local held = redis.call('ZCARD', K_LEASES)
  while held < limit do
    local head = redis.call('ZPOPMIN', K_QUEUE)
    if #head == 0 then return end
    local id = head[1]
    local deadline = redis.call('ZSCORE', K_WEXP, id)
    redis.call('ZREM', K_WEXP, id)
    if deadline then
      redis.call('ZADD', K_LEASES, deadline, id)
      local box = MBOX .. string.match(id, '^[^:]+')
      redis.call('RPUSH', box, id)
      redis.call('PEXPIRE', box, 3 * TTL)
      held = held + 1
    end
  end
end

local function remove(id)
  redis.call('ZREM', K_QUEUE, id)
  redis.call('ZREM', K_WEXP, id)
  redis.call('ZREM', K_LEASES, id)
end

-- {status, limit, held, queued, stamp, expiry, ...}: the stamp (Redis's µs; scripts run one
-- at a time) lets a client ignore an older answer that reaches it after a newer one; expiry
-- is the milliseconds until the next lease expires or the grace period ends (-1: neither),
-- when a process with waiters checks again. Nothing held or queued: the ticket counter goes
-- (it restarts from anything), and the clock too once no process lives on the limit.
local function answer(status, limit, ...)
  local stamp = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local first = redis.call('ZRANGE', K_LEASES, 0, 0, 'WITHSCORES')
  local expiry = -1
  if #first == 2 then expiry = math.max(0, tonumber(first[2]) - now) end
  local grace = grace_left()
  if grace > 0 and (expiry < 0 or grace < expiry) then expiry = grace end
  local held, queued = redis.call('ZCARD', K_LEASES), redis.call('ZCARD', K_QUEUE)
  redis.call('SET', K_TALLY, held)
  if held == 0 and queued == 0 then
    redis.call('DEL', K_SEQ)
    if redis.call('EXISTS', K_MEMBERS) == 0 then redis.call('DEL', K_CLOCK) end
  end
  local out = {status, limit, held, queued, stamp, expiry}
  for _, v in ipairs({...}) do out[#out + 1] = v end
  return out
end
"""

# ARGV[6] max_queue (-1: unbounded), ARGV[7...] waiter ids in this process's arrival order.
# Each is admitted at once if nobody queues, no grace period runs and a slot is free, shed
# if max_queue already wait, else queued with the next ticket. Answers {0, limit, held,
# queued, stamp, expiry, statuses}: a status per id, 0 queued, 1 admitted, 2 shed.
# Idempotent per id.
ACQUIRE: Final = (
    _PRELUDE
    + """
reap()
member()
local limit = current_limit()
grant(limit)
local max_queue = tonumber(ARGV[6])
local grace = grace_left() > 0
local statuses = {}
for i = 7, #ARGV do
  local id = ARGV[i]
  local status = 0
  if redis.call('ZSCORE', K_LEASES, id) then
    status = 1
  elseif not redis.call('ZSCORE', K_WEXP, id) then
    local queued = redis.call('ZCARD', K_QUEUE)
    if queued == 0 and not grace and redis.call('ZCARD', K_LEASES) < limit then
      redis.call('ZADD', K_LEASES, now + TTL, id)
      status = 1
    elseif max_queue >= 0 and queued >= max_queue then
      status = 2
    else
      redis.call('ZADD', K_QUEUE, redis.call('INCR', K_SEQ), id)
      redis.call('ZADD', K_WEXP, now + TTL, id)
    end
  end
  statuses[#statuses + 1] = status
end
return answer(0, limit, statuses)
"""
)

# ARGV[6...] ids: leases given back, waiters that left, anything to drop. Frees their slots
# to the oldest waiters. Answers {0, limit, held, queued, stamp, expiry}. Idempotent.
REMOVE: Final = (
    _PRELUDE
    + """
reap()
local limit = current_limit()
for i = 6, #ARGV do remove(ARGV[i]) end
grant(limit)
return answer(0, limit)
"""
)

# A process closes: as REMOVE for ARGV[6...], and the process leaves the members and drops
# its mailbox. Answers {0, limit, held, queued, stamp, expiry}.
LEAVE: Final = (
    _PRELUDE
    + """
reap()
local limit = current_limit()
for i = 6, #ARGV do remove(ARGV[i]) end
redis.call('ZREM', K_MEMBERS, PROC)
redis.call('DEL', MBOX .. PROC)
grant(limit)
return answer(0, limit)
"""
)

# The heartbeat and re-check of one process. ARGV[6] = n held lease ids, then those ids;
# then m queued waiter ids (count first), then ids to drop (the rest).
# Held leases are renewed, and re-registered if Redis lost them or they expired (the work
# is still running, and counts before anything is granted; over the limit, too, when a
# process cut off comes back: nothing is granted until the work drains). While a grace
# period rebuilds a lost state, a lease re-registered must fit the limit: one that would
# not is refused (its process counts it lost). Queued
# waiters are renewed, reported if they were handed a slot, re-queued at the back if Redis
# lost them (or lost the queue without their deadlines). Answers {0, limit, held, queued,
# stamp, expiry, granted ids, re-registered ids, re-queued ids, refused ids}.
SYNC: Final = (
    _PRELUDE
    + """
reap()
member()
local limit = current_limit()
local n = tonumber(ARGV[6])
local held_from, queued_from = 7, 8 + n
local drops_from = queued_from + tonumber(ARGV[7 + n])
-- Drops first: a slot they free is one a lost lease may take back.
for j = drops_from, #ARGV do remove(ARGV[j]) end
local reclaimed, granted, requeued, refused, missing = {}, {}, {}, {}, {}
for j = held_from, queued_from - 2 do
  local id = ARGV[j]
  if redis.call('ZADD', K_LEASES, 'XX', 'CH', now + TTL, id) == 0
      and not redis.call('ZSCORE', K_LEASES, id) then
    missing[#missing + 1] = id
  end
end
local held = redis.call('ZCARD', K_LEASES)
local rebuilding = grace_left() > 0
for _, id in ipairs(missing) do
  if held < limit or not rebuilding then
    redis.call('ZADD', K_LEASES, now + TTL, id)
    reclaimed[#reclaimed + 1] = id
    held = held + 1
  else
    refused[#refused + 1] = id
  end
end
local queue_lost = redis.call('ZCARD', K_QUEUE) < redis.call('ZCARD', K_WEXP)
for j = queued_from, drops_from - 1 do
  local id = ARGV[j]
  local waiting = redis.call('ZSCORE', K_WEXP, id)
  if waiting and not (queue_lost and not redis.call('ZSCORE', K_QUEUE, id)) then
    redis.call('ZADD', K_WEXP, now + TTL, id)
  elseif redis.call('ZSCORE', K_LEASES, id) then
    redis.call('ZADD', K_LEASES, now + TTL, id)
    granted[#granted + 1] = id
  else
    redis.call('ZADD', K_QUEUE, redis.call('INCR', K_SEQ), id)
    redis.call('ZADD', K_WEXP, now + TTL, id)
    requeued[#requeued + 1] = id
  end
end
grant(limit)
return answer(0, limit, granted, reclaimed, requeued, refused)
"""
)

# ARGV[6] size, ARGV[7] "resize" (set it) or "configure" (a process starts with this size).
# A configured size is taken if the limit's state is missing (restored as above), if it is
# the size processes start with or the size in force (a process restarting keeps a runtime
# resize), or if no other process lives on the limit (a new configuration rolls out once
# the old one's processes are gone). Otherwise it disagrees with live processes: status
# CONFLICT, nothing changed. Growing hands the new slots to the oldest waiters at once;
# shrinking revokes nothing. Answers {status, limit, held, queued, stamp, expiry,
# configured size or "", the maxmemory-policy if a maxmemory is set or ""}.
CONFIGURE: Final = (
    _PRELUDE
    + """
reap()
local CONFLICT = 3
local size, kind = tonumber(ARGV[6]), ARGV[7]
local limit = tonumber(redis.call('GET', K_LIMIT))
local configured = tonumber(redis.call('GET', K_CONFIGURED))
local status = 0
if limit == nil then
  restore(size)
  if kind == 'configure' then redis.call('SET', K_CONFIGURED, size) end
elseif kind == 'resize' then
  redis.call('SET', K_LIMIT, size)
elseif configured == nil then  -- (restored by a resize): the size in force stays
  redis.call('SET', K_CONFIGURED, size)
elseif size ~= configured and size ~= limit then
  local others = redis.call('ZCARD', K_MEMBERS)
  if redis.call('ZSCORE', K_MEMBERS, PROC) then others = others - 1 end
  if others > 0 then
    status = CONFLICT
  else
    redis.call('SET', K_LIMIT, size)
    redis.call('SET', K_CONFIGURED, size)
  end
end
if status == 0 then member() end
limit = tonumber(redis.call('GET', K_LIMIT))
grant(limit)
local memory = redis.call('INFO', 'memory')
local policy = ''
if (tonumber(string.match(memory, 'maxmemory:(%d+)')) or 0) > 0 then
  policy = string.match(memory, 'maxmemory_policy:([%w-]+)') or ''
end
return answer(status, limit, tostring(configured or ''), policy)
"""
)

# Run on every new connection, before its first command. KEYS: `limit`, `clock`, `grace`;
# ARGV[1] lease milliseconds. If the limit's state was kept by another Redis than this one (a
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
  redis.call('SET', KEYS[3], '1', 'PX', ARGV[1])
  redis.call('HSET', KEYS[2], 'g', real + tonumber(ARGV[1]))  -- (the grace's mirror)
  return 1
end
return 0
"""
