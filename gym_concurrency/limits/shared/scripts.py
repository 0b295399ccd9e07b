"""The Lua scripts of a limit shared across processes (`SharedLimit`): each step is atomic in
Redis (or Valkey), reads the limit's state once and writes it once, and keeps time with the
limit's own clock (Redis `TIME`, never a client's, less the time Redis was stopped).

The Lua is in `lua/` beside this module (package data): every script is `state.lua` (keys,
arguments, the state read once), `flows.lua` (fair queuing by flow), `budget.lua` (rate
budgets), `queue.lua` (clock,
grace periods, leases, the queue, `answer()`) and its own file, read once at import into the
constants below; `_store` registers them and unpacks their answers.

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
                 id    in a Redis Cluster, the node that wrote it (CLUSTER MYID): a script
                       on another node (a replica promoted) starts a grace period
                 fw, fh, f0, x, fn  fair queuing by flow (see `_lua_flows`)
                 b     the rate budgets' counts (JSON; see `budget.lua`)
7. `members`     ZSET process id -> deadline (clock ms): the processes alive on this limit
8-11. `fq`, `ready`, `fheld`, `dq`: fair queuing by flow (see `_lua_flows`)
12. `capped`     HASH waiter id -> its lease's id, for a waiter granted less than it asked
                 (see below), while the lease is held
13. `budget`     HASH `<budget><second>` -> charged, `m`: the budgets' window (budget.lua)
14. `bgrant`     ZSET `<proc>:<n>` -> the second charged, for waiters granted from the queue
                 and `o<proc>:<batch>` -> the second applied, for batches of settlements
15. `mbox:<proc>` LIST of lease ids granted to process `<proc>` (its waiters are woken by
                 BLPOP); the key is the common `ARGV[1]` prefix plus the process id

`limit`, `configured` and `state` stay once made; the others are gone once nothing is held,
queued or alive. A key lost on its own (evicted under an allkeys-* `maxmemory-policy`, or
deleted) never admits more than the limit: the counts live in `state`, so losing `leases`
or `queue` changes no decision, and the next renewal (any process's, a third of a lease at
most) finds the keys disagree with them and starts a grace period; `state` lost (its `n`
missing while the size is known) starts one at once. A grace period hands out nothing
while live processes re-register what they hold.

Ids are `<proc>:<n>`, with `*<w>` for a weight w other than 1 and `@<flow>` for a named
flow, and never sent twice: a waiter that is handed a slot keeps its id as the lease id, the
process part names the mailbox to notify, and the weight and flow ride along (no lookup).
The waiter chosen next (FIFO by ticket in one flow; see `_lua_flows` for several) is never
passed; capacity that frees is kept for it until its weight fits. One heavier than the limit
(shrunk under it: a resize, an adaptive step) is granted the whole limit instead, under a
lease id that adds `/<granted>` to its own (`<proc>:<n>*<w>/<c>@<flow>` weighs c): the
weight counted is in the id as ever, and `capped` lets a renewal naming the waiter find it.

Every script takes the same first six arguments: mailbox prefix, lease milliseconds, the
limit as last seen (restored if the state is gone), this process's id, "1" if this
process has seen the limit's state before (so that its absence means Redis lost it; "0"
if not, with "c" after it in a Redis Cluster, where every script runs CLUSTER MYID), and
the rate budgets with the settlements and provider readings to apply first (`budget.lua`;
"" for a limit without budgets, for which none of it runs).
Every script answers `{status, limit, weight held, waiters queued, stamp, expiry, weight
queued, flows waiting, budgets, ...}`: Redis's time in microseconds, milliseconds until a
lease may expire, the grace period ends or the waiter chosen next fits the budgets (-1:
none), and the budgets as JSON ("" without): `s` the second charged now, `b` ms the waiter
chosen next waits for them (-1: none), `r` each budget's remaining, `p` the provider's
reading in force.

With budgets (13. `budget`, 14. `bgrant`: see `budget.lua`), a waiter's estimate rides in
its id (`<proc>:<n>.<tokens>`), and an admission takes its slot and its estimate together or
neither: at once in ACQUIRE, or when `grant` hands it a slot (the waiter chosen next that
fits in slots but not in the budgets is not passed; the answer says how long it waits).

Commands per call, on the admission path: an admission 4 (TIME, HMGET, ZADD, HSET), a
release 4, a waiter queued 5, a release that hands its slot on 9. With budgets, an admission
1 more (HSET of the second's charges), a settlement that refunds 2 (HMGET, HSET), and once a
second 3 (HMGET, HDEL of the seconds that left the window, PEXPIRE). In a Redis Cluster,
every call 1 more (CLUSTER MYID, see `id`).
"""

from __future__ import annotations

from importlib.resources import files
from typing import Final

__all__ = [
    "ACQUIRE", "CHECK_SERVER", "CONFIGURE", "CONFLICT", "ENGINE_KEY_NAMES", "ENGINE_SIZE",
    "ENGINE_TURN", "KEY_NAMES", "LEAVE", "REMOVE", "SYNC",
]  # fmt: skip

KEY_NAMES: Final = (
    "limit", "queue", "wexp", "leases", "configured", "state", "members",
    "fq", "ready", "fheld", "dq", "capped", "budget", "bgrant",
)  # fmt: skip

CONFLICT: Final = 3  # CONFIGURE's status: live processes hold another size for this limit


def _lua(name: str) -> str:
    """The text of `lua/<name>`, as installed with the package."""
    return (files(__package__) / "lua" / name).read_text(encoding="utf-8")


_PRELUDE: Final = "".join(
    _lua(name) for name in ("state.lua", "flows.lua", "budget.lua", "queue.lua")
)


def _script(name: str) -> str:
    """A script run with EVALSHA: the prelude every script shares, then its own `name`."""
    return _PRELUDE + _lua(name)


# ARGV[7] max_queue (-1: unbounded), ARGV[8] n, then n ids to remove first (as REMOVE: a
# release and an acquire of the same moment cost one call), then new waiter ids in this
# process's arrival order. Each is admitted at once if nobody queues, no grace period runs
# and a slot is free, shed if max_queue already wait, else queued with the next ticket.
# Answers {0, limit, held, queued, stamp, expiry, queued weight, flows, budgets, statuses,
# waits}: a status per new id, 0 queued, 1 admitted (its weight and estimate fit), 2 shed;
# with budgets, per new id the ms until its estimate alone fits them (0: now). One heavier
# than the limit (its process saw an older, larger size) is queued, and granted at once if
# the limit is idle.
ACQUIRE: Final = _script("acquire.lua")


# ARGV[7...] ids: leases given back, waiters that left, anything to drop. Frees their slots
# to the oldest waiters. Answers the common head (see `answer`). Idempotent.
REMOVE: Final = _script("remove.lua")


# A process closes: as REMOVE for ARGV[7...], and the process leaves the members and drops
# its mailbox. Answers the common head.
LEAVE: Final = _script("leave.lua")


# The heartbeat and re-check of one process. ARGV[7] = n held lease ids, then those ids;
# then m queued waiter ids (count first), then ids to drop (the rest). It also checks the
# state's counts against the keys: fewer leases than counted means the leases key was lost
# (a grace period); the counts are set to the keys'. Drops come first. Held leases are
# renewed, and re-registered if Redis lost them or they expired: the work is still running,
# and counts before anything is granted, over the limit too (a process cut off that comes
# back, a local fallback's slots): Redis then grants nothing until the work drains, where
# leaving it out would hand the same slots out twice. Queued waiters are renewed, reported
# if they were handed a slot, re-queued at the back if Redis lost them (or lost the queue).
# Answers the common head, then granted ids, re-registered ids, re-queued ids.
SYNC: Final = _script("sync.lua")


# ARGV[7] size, ARGV[8] "resize" (set it) or "configure" (a process starts with this size).
# A configured size is taken if the limit's state is missing (restored as above), if it is
# the size processes start with or the size in force (a process restarting keeps a runtime
# resize), or if no other process lives on the limit (a new configuration rolls out once
# the old one's processes are gone). Otherwise it disagrees with live processes: status
# CONFLICT, nothing changed. Growing hands the new slots to the oldest waiters at once;
# shrinking revokes nothing. Answers the common head, then the configured size or "", and
# the maxmemory-policy if a maxmemory is set or "".
CONFIGURE: Final = _script("configure.lua")


# Run on every new connection, before its first command. KEYS: `limit`, `state`; ARGV[1]
# lease milliseconds, ARGV[2] "c" in a Redis Cluster (the node's id is kept as `id` too, as
# every script there checks: a connection kept from before its node's promotion runs no
# check). If the limit's state was kept by another Redis than this one (a
# replica promoted by a failover, a snapshot restored: its last writes may be missing), hand
# out nothing for one lease while live processes re-register what they hold. Every process
# reconnects after a failover, so one of them finds it before any script runs there.
# Answers 1 if it started a grace period, 2 if the state is missing (a restart: the process
# renews at once, so that its holders count again soon), else 0.
CHECK_SERVER: Final = _lua("check_server.lua")


# A limit that follows an engine for every process (`_engine.py`) keeps two keys of its own
# under the same hash tag: `engine_lease` (STRING, the id of the process that scrapes, expiring
# unless renewed) and `engine` (HASH: waiting, cache, running as the last scrape read them, and
# `at`, Redis's ms when that scrape was sent). Neither is read by the admission scripts.
ENGINE_KEY_NAMES: Final = ("engine_lease", "engine")  # (after KEY_NAMES, for ENGINE_SIZE)

# KEYS: engine_lease, engine. ARGV[1] process id, ARGV[2] lease ms. Takes or renews the lease
# if free or this process's. Answers {1 if this process holds it, Redis's time (ms), waiting,
# cache, running, at ("" for a field not kept)}.
ENGINE_TURN: Final = _lua("engine_turn.lua")

# The engine's holder sizes the limit (`_engine.py`). KEYS: the limit's, then engine_lease,
# engine. ARGV[7] "held" (the size is the weight held now + ARGV[9], the room a reading
# leaves, negative for a queue over its bound) or "set" (the size is ARGV[9]: the floor, or 0
# for a full cache), ARGV[8] the most it may be, ARGV[10..12] waiting, cache, running of the
# reading to keep ("" for ARGV[10]: none), ARGV[13] ms it is kept, ARGV[14] ms since its
# scrape was sent. Only while this process holds the engine lease, checked in the same call:
# a holder that lost it (stalled, cut off) changes nothing. Status 1 if it sized the limit,
# else 0; then the common head.
ENGINE_SIZE: Final = _script("engine_size.lua")
