"""The Lua scripts of a limit shared across processes (`SharedLimit`): each step is atomic in
Redis (or Valkey), reaps expired leases and waiters first, and reads the clock with Redis
`TIME`, never a client's.

Keys, all under one hash tag so that they live in one cluster slot (`KEYS` order):

1. `limit`       the global number of slots (string)
2. `seq`         the ticket counter (INCR): FIFO order across processes
3. `queue`       ZSET waiter id -> ticket: the global queue, oldest first
4. `wexp`        ZSET waiter id -> deadline (ms): a waiter whose process stops renewing it is
                 reaped, so a dead process never blocks the queue
5. `leases`      ZSET lease id -> deadline (ms): the slots held now, one lease each
6. `grace`       present for a moment after Redis lost its state (restart without persistence):
                 no slot is handed out until live processes have re-registered their leases
7. `configured`  the size the last starting process was configured with
8. `mbox:<proc>` LIST of lease ids granted to process `<proc>` (its waiters are woken by BLPOP);
                 the key is the common `ARGV[1]` prefix plus the process id

Ids are `<proc>:<n>`: a waiter that is handed a slot keeps its id as the lease id, and the
process part names the mailbox to notify. Every script takes the same first five arguments:
mailbox prefix, lease milliseconds, the limit as last seen (restored if the key is gone),
"1" if this process has seen the state before (so a missing `limit` means Redis lost it), and
the grace milliseconds. Every script answers `{status, limit, leases held, waiters queued,
stamp, expiry, ...}`: Redis's clock in microseconds, and milliseconds until the next lease
expires.
"""

from __future__ import annotations

from typing import Final

__all__ = ["ACQUIRE", "CONFIGURE", "KEY_NAMES", "REMOVE", "SYNC"]

KEY_NAMES: Final = ("limit", "seq", "queue", "wexp", "leases", "grace", "configured")

_PRELUDE: Final = """
local K_LIMIT, K_SEQ, K_QUEUE, K_WEXP, K_LEASES, K_GRACE, K_CONFIGURED =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local MBOX, TTL = ARGV[1], tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- Drop expired leases (their process stopped renewing them) and expired waiters.
local function reap()
  redis.call('ZREMRANGEBYSCORE', K_LEASES, '-inf', now)
  while true do
    local dead = redis.call('ZRANGEBYSCORE', K_WEXP, '-inf', now, 'LIMIT', 0, 500)
    if #dead == 0 then break end
    redis.call('ZREM', K_QUEUE, unpack(dead))
    redis.call('ZREM', K_WEXP, unpack(dead))
  end
end

-- The global size; if Redis lost it, restore the last seen one and, when this process knew
-- the state before, hold grants back until live processes have re-registered their leases.
local function current_limit()
  local limit = tonumber(redis.call('GET', K_LIMIT))
  if limit == nil then
    limit = tonumber(ARGV[3])
    redis.call('SET', K_LIMIT, limit)
    if ARGV[4] == '1' then
      redis.call('SET', K_GRACE, '1', 'PX', ARGV[5])
    end
  end
  return limit
end

-- Hand free slots to the oldest waiters: the lease keeps the waiter's id and deadline (its
-- process renews it from then on) and the waiter's process is told through its mailbox.
local function grant(limit)
  if redis.call('EXISTS', K_GRACE) == 1 then return end
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

-- {head, limit, held, queued, stamp, expiry, ...}: the stamp (server microseconds; scripts
-- run one at a time) lets a client ignore an older answer that reaches it after a newer one;
-- expiry is the milliseconds until the next lease expires (-1: none), when a process with
-- waiters checks again (a dead holder's slot passes on as soon as its lease is gone).
local function answer(head, limit, ...)
  local stamp = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local first = redis.call('ZRANGE', K_LEASES, 0, 0, 'WITHSCORES')
  local expiry = -1
  if #first == 2 then expiry = math.max(0, tonumber(first[2]) - now) end
  local out = {head, limit, redis.call('ZCARD', K_LEASES), redis.call('ZCARD', K_QUEUE), stamp,
               expiry}
  for _, v in ipairs({...}) do out[#out + 1] = v end
  return out
end
"""

# ARGV[6] max_queue (-1: unbounded), ARGV[7...] waiter ids in this process's arrival order.
# Each is admitted at once if nobody queues and a slot is free, shed if max_queue already
# wait, else queued with the next ticket. Answers {0, limit, held, queued, stamp, expiry,
# statuses}:
# a status per id, 0 queued, 1 admitted, 2 shed. Idempotent per id.
ACQUIRE: Final = (
    _PRELUDE
    + """
reap()
local limit = current_limit()
grant(limit)
local max_queue = tonumber(ARGV[6])
local grace = redis.call('EXISTS', K_GRACE) == 1
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

# The heartbeat and re-check of one process. ARGV[6] = n held lease ids, then those ids;
# then m queued waiter ids (count first), then ids to drop (the rest).
# Held leases are renewed (re-registered if Redis lost them: the work is still running);
# queued waiters are renewed, reported if they were handed a slot, re-queued at the back if
# Redis lost them. Answers {0, limit, held, queued, stamp, expiry, granted ids, re-registered ids,
# re-queued ids}.
SYNC: Final = (
    _PRELUDE
    + """
reap()
local limit = current_limit()
local i = 6
local n = tonumber(ARGV[i])
i = i + 1
local reclaimed, granted, requeued = {}, {}, {}
for j = i, i + n - 1 do
  local id = ARGV[j]
  if not redis.call('ZSCORE', K_LEASES, id) then reclaimed[#reclaimed + 1] = id end
  redis.call('ZADD', K_LEASES, now + TTL, id)
end
i = i + n
n = tonumber(ARGV[i])
i = i + 1
for j = i, i + n - 1 do
  local id = ARGV[j]
  if redis.call('ZSCORE', K_WEXP, id) then
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
i = i + n
for j = i, #ARGV do remove(ARGV[j]) end
grant(limit)
return answer(0, limit, granted, reclaimed, requeued)
"""
)

# ARGV[6] size, ARGV[7] "resize" (set it) or "configure" (a process starts: set it only if
# its configured size is new, so a restart keeps a runtime resize but a changed configuration
# rolls out). Growing hands the new slots to the oldest waiters at once; shrinking revokes
# nothing. Answers {0, limit, held, queued, stamp, expiry}.
CONFIGURE: Final = (
    _PRELUDE
    + """
reap()
local size = ARGV[6]
if ARGV[7] == 'resize' or redis.call('GET', K_CONFIGURED) ~= size
    or redis.call('EXISTS', K_LIMIT) == 0 then
  redis.call('SET', K_LIMIT, size)
end
if ARGV[7] == 'configure' then redis.call('SET', K_CONFIGURED, size) end
local limit = tonumber(redis.call('GET', K_LIMIT))
grant(limit)
return answer(0, limit)
"""
)
