"""One OS process holding a SharedLimit, driven by the fault tests through the witness Redis.

`python -m tests.shared.faults.agent '<json>'` with {"name", "url", "witness_url", "key",
"limit", "options", "connect", "weights", "flows"} (`weights`, `flows`: what each `demand`
admission asks for and in which flow, picked at random; the witness counts weight). The
agent reads commands from the witness (BLPOP `ctl:<name>`, JSON) and answers each on
`ack:<name>`; the limit's own Redis is never used for control, so pausing, restarting or
cutting it off leaves the agent steerable.

Commands (`op`):
- connect:  `await limit.connect()` (an agent started with "connect": false has not talked
            to Redis yet); answers {"connected"} or {"error"} if connect() raised.
- demand:   run `clients` closed-loop clients: each takes a slot, holds it `hold` s (a random
            pick between the two bounds) inside the witness, gives it back, again; a refusal
            naps `nap` s before trying again.
- hold:     take `slots` more slots (each witnessed as agent `<name>.hold`), answer once
            all are held (or `wait` s passed: {"held": n}).
- stall:    block the event loop (`time.sleep`, as a handler doing CPU work would) `seconds`.
- release:  leave the witness and give back every slot `hold` took.
- resize:   `limit.resize(size)`.
- counts:   the limit's counters and the clients' own tally, now.
- stop:     stop the clients, give back every slot, close the limit, answer the final counts,
            exit.
Every witness entry carries `r` (a slot Redis granted) or `f` (the local fallback's).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sys
import time
from typing import Any

import redis.asyncio as aioredis

from gym_concurrency import LimitUnavailableError, QueueFullError, SharedLimit
from tests.shared.faults.witness import LOG, RECORD

OUTCOMES = ("admitted", "timeouts", "cancelled", "shed", "unavailable")


class Agent:
    def __init__(self, config: dict[str, Any]) -> None:
        self.name: str = config["name"]
        self.witness = aioredis.Redis.from_url(config["witness_url"], decode_responses=True)
        self.record = self.witness.register_script(RECORD)
        options = {"key": config["key"], **config.get("options", {})}
        if options["key"] is None:  # the limit named by component / limit_name instead
            del options["key"]
        self.limit = SharedLimit(config["limit"], redis_url=config["url"], **options)
        self.rng = random.Random(config.get("seed", 0))
        self.weights: list[int] = config.get("weights") or [1]
        self.flows: list[str | None] = config.get("flows") or [None]
        self.clients: list[asyncio.Task[None]] = []
        self.wanted = 0
        self.hold_range = (0.05, 0.1)
        self.nap = 0.05
        self.held: list[str] = []  # how each slot of `hold` was admitted
        self.hold_name = f"{self.name}.hold"  # the witness's name for the slots `hold` took
        self.seen = dict.fromkeys(("arrived", *OUTCOMES, "fallback"), 0)

    async def witnessed(self, delta: int, how: str, who: str | None = None) -> None:
        await self.record(keys=[LOG], args=[delta, who or self.name, how])

    def how(self) -> str:
        """ "f" if the slot just admitted came from the local fallback (Redis is away)."""
        return "r" if self.limit.connected else "f"

    async def take(
        self, who: str | None = None, weight: int = 1, flow: str | None = None
    ) -> str | None:
        """One admission of `weight` in `flow`, tallied by how it ended; how the slot came if
        admitted."""
        self.seen["arrived"] += 1
        try:
            await self.limit.acquire(weight, flow)
        except TimeoutError:
            self.seen["timeouts"] += 1
        except QueueFullError:
            self.seen["shed"] += 1
        except LimitUnavailableError:
            self.seen["unavailable"] += 1
        except asyncio.CancelledError:
            self.seen["cancelled"] += 1
            raise
        else:
            self.seen["admitted"] += 1
            how = self.how()
            self.seen["fallback"] += how == "f"
            await self.witnessed(weight, how, who)
            return how
        return None

    async def client(self, number: int) -> None:
        while number < self.wanted:
            weight, flow = self.rng.choice(self.weights), self.rng.choice(self.flows)
            how = await self.take(weight=weight, flow=flow)
            if how is None:
                await asyncio.sleep(self.nap)
                continue
            try:
                await asyncio.sleep(self.rng.uniform(*self.hold_range))
            finally:
                # The held section ends (the witness is told) before the slot is given back.
                await asyncio.shield(self.witnessed(-weight, how))
                self.limit.release(weight, flow)

    async def demand(self, clients: int, hold: list[float], nap: float = 0.05) -> dict[str, Any]:
        self.hold_range = (hold[0], hold[1])
        self.nap = nap
        self.wanted = clients
        self.clients = [c for c in self.clients if not c.done()]
        for number in range(len(self.clients), clients):
            self.clients.append(asyncio.create_task(self.client(number)))
        return {"clients": clients}

    async def hold(self, slots: int, wait: float = 30.0) -> dict[str, Any]:
        async def one() -> None:
            how = await self.take(self.hold_name)
            if how is not None:
                self.held.append(how)

        tasks = [asyncio.create_task(one()) for _ in range(slots)]
        await asyncio.wait(tasks, timeout=wait)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return {"held": len(self.held)}

    async def release(self) -> dict[str, Any]:
        released = len(self.held)
        while self.held:
            await self.witnessed(-1, self.held.pop(), self.hold_name)
            self.limit.release()
        return {"released": released}

    def counts(self) -> dict[str, Any]:
        limit = self.limit
        return {
            "seen": dict(self.seen),
            "counted": {
                "timeouts": limit.admission_timeouts,
                "cancelled": limit.admission_cancelled,
                "shed": limit.admission_shed,
                "unavailable": limit.admission_unavailable,
                "lease_lost": getattr(limit, "admission_lease_lost", None),
            },
            "active": limit.active,
            "queue_depth": limit.queue_depth,
            "connected": limit.connected,
            "mode": limit.redis_unavailable,
            "global_active": limit.global_active,
            "limit": limit.limit,
        }

    async def stop(self) -> dict[str, Any]:
        self.wanted = 0
        dump = asyncio.get_running_loop().call_later(20, self.dump, "stop stalled")
        await asyncio.gather(*self.clients, return_exceptions=True)
        dump.cancel()
        await self.release()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(10):
                while self.limit._sync.background:  # noqa: ASYNC110 - every release has been sent
                    await asyncio.sleep(0.01)
        await self.limit.close()
        return self.counts()

    def dump(self, why: str) -> None:
        """Write the limit's state, its waiters and every task's stack to stderr (the agent's
        log, which a test that timed out waiting on this agent shows)."""
        out = sys.stderr
        print(f"--- {self.name}: {why}; {self.limit!r} {self.limit.statistics()}", file=out)
        for waiter in self.limit._state.waiters.all():
            print(f"waiter {waiter.id} weight {waiter.weight} flow {waiter.flow} registered "
                  f"{waiter.registered} sent_at {waiter.sent_at}", file=out)  # fmt: skip
        for task in asyncio.all_tasks():
            task.print_stack(limit=12, file=out)
        out.flush()

    async def handle(self, command: dict[str, Any]) -> dict[str, Any]:
        op = command.pop("op")
        if op == "connect":
            try:
                return {"connected": await self.limit.connect()}
            except Exception as error:  # the test reads what a failed start says
                return {"error": f"{type(error).__name__}: {error}"}
        if op == "demand":
            return await self.demand(**command)
        if op == "hold":
            return await self.hold(**command)
        if op == "stall":
            time.sleep(command["seconds"])  # noqa: ASYNC251 - the fault: a blocked loop
            return {}
        if op == "release":
            return await self.release()
        if op == "resize":
            self.limit.resize(command["size"])
            return {}
        if op == "counts":
            return self.counts()
        if op == "stop":
            return await self.stop()
        raise ValueError(f"unknown op {op!r}")

    async def run(self, connect: bool) -> None:
        if connect:
            await self.limit.connect()
        await self.witness.rpush("ready", self.name)
        while True:
            item = await self.witness.blpop([f"ctl:{self.name}"], timeout=1)
            if item is None:
                continue
            command = json.loads(item[1])
            op = command["op"]
            try:
                reply = await self.handle(command)
            except Exception as error:
                reply = {"error": f"{type(error).__name__}: {error}"}
            await self.witness.rpush(f"ack:{self.name}", json.dumps(reply))
            if op == "stop":
                await self.witness.aclose()
                return


def main() -> None:
    config = json.loads(sys.argv[1])
    agent = Agent(config)
    asyncio.run(agent.run(config.get("connect", True)))


if __name__ == "__main__":
    main()
