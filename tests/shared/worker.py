"""One OS process sharing a SharedLimit, driven by the multi-process tests.

`python -m tests.shared.worker '<json>'` with {"url", "key", "limit", "role", "name", ...}.
Roles:
- flood: `requests` tasks at once, each holds its slot `hold` s with a witness (INCR/DECR of
  a Redis key inside the held section); reports the highest witness count it saw.
- hold:  takes `slots` slots, says so (RPUSH `events`), then sleeps until killed.
- wait:  enqueues `waiters` waiters, `gap` s apart, logging each arrival and admission to
  Redis lists, holds each `hold` s.
- soak:  `requests` arrivals at random times with random holds, cancellations and timeouts;
  reports every outcome as it saw it and as the limit counted it.
- budget: `requests` admissions at once of `tokens` each on a limit with the rate budget
  `budget` (RateBudget's keywords), each settled with `used` tokens; reports how each ended.
Every role waits for a "go" token (BLPOP `<key>:go`) first, and ends with a JSON report on
stdout (the hold role never ends).
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from typing import Any

import redis.asyncio as aioredis

from gym_concurrency import LimitUnavailableError, QueueFullError, SharedLimit
from gym_concurrency.limits.rate_budget import RateBudget


async def main(config: dict[str, Any]) -> dict[str, Any]:
    client = aioredis.Redis.from_url(config["url"], decode_responses=True)
    # The witness lives on a Redis of its own (default: the limit's), so that pausing or
    # restarting the limit's Redis cannot lose or stall its count.
    witness_url = config.get("witness_url", config["url"])
    witness = aioredis.Redis.from_url(witness_url, decode_responses=True)
    options = config.get("options", {})
    if "budget" in config:
        options = {**options, "budget": RateBudget(**config["budget"])}
    limit = SharedLimit(config["limit"], redis_url=config["url"], key=config["key"], **options)
    await limit.connect()
    await client.rpush(f"{config['key']}:ready", config["name"])
    await client.blpop([f"{config['key']}:go"], timeout=30)
    role = ROLES[config["role"]]
    report = await role(limit, client, witness, config)
    while limit._sync.background:  # noqa: ASYNC110 - every release has reached Redis
        await asyncio.sleep(0.01)
    report.update(
        name=config["name"],
        counted={
            "timeouts": limit.admission_timeouts,
            "cancelled": limit.admission_cancelled,
            "shed": limit.admission_shed,
            "unavailable": limit.admission_unavailable,
        },
        active=limit.active,
        queue_depth=limit.queue_depth,
    )
    await limit.close()
    await client.aclose()
    await witness.aclose()
    return report


async def witnessed(client: aioredis.Redis, key: str, hold: float, seen: list[int]) -> None:
    seen.append(await client.incr(f"{key}:witness"))
    try:
        await asyncio.sleep(hold)
    finally:
        await client.decr(f"{key}:witness")


async def flood(
    limit: SharedLimit, client: aioredis.Redis, witness: aioredis.Redis, config: dict[str, Any]
) -> dict[str, Any]:
    seen: list[int] = []

    async def one() -> None:
        async with limit:
            await witnessed(witness, config["key"], random.uniform(*config["hold"]), seen)

    await asyncio.gather(*(one() for _ in range(config["requests"])))
    return {"admitted": len(seen), "max_witness": max(seen, default=0)}


async def hold(
    limit: SharedLimit, client: aioredis.Redis, witness: aioredis.Redis, config: dict[str, Any]
) -> dict[str, Any]:
    for _ in range(config["slots"]):
        await limit.acquire()
    await client.rpush(f"{config['key']}:events", f"holding {config['name']}")
    await asyncio.sleep(3600)
    return {}


async def wait(
    limit: SharedLimit, client: aioredis.Redis, witness: aioredis.Redis, config: dict[str, Any]
) -> dict[str, Any]:
    key, name = config["key"], config["name"]
    await asyncio.sleep(config.get("delay", 0))

    async def one(n: int) -> float:
        future = limit.enqueue()
        await client.rpush(f"{key}:arrivals", f"{name}-{n}")
        assert await future == "admitted"
        admitted_at = time.time()
        await client.rpush(f"{key}:admissions", f"{name}-{n}")
        await asyncio.sleep(config.get("hold", 0))
        limit.release()
        return admitted_at

    tasks = []
    for n in range(config["waiters"]):
        tasks.append(asyncio.create_task(one(n)))
        await asyncio.sleep(config.get("gap", 0))
    return {"admitted_at": await asyncio.gather(*tasks)}


async def soak(
    limit: SharedLimit, client: aioredis.Redis, witness: aioredis.Redis, config: dict[str, Any]
) -> dict[str, Any]:
    rng = random.Random(config["seed"])
    seen: list[int] = []
    outcomes = {"admitted": 0, "timeouts": 0, "cancelled": 0, "shed": 0, "unavailable": 0}

    async def one(held_for: float, mode: str) -> None:
        admitted = False
        try:
            if mode == "enqueue":  # the middleware's way: enqueue, await, leave if it gives up
                future = limit.enqueue()
                try:
                    result = await future
                except asyncio.CancelledError:
                    limit.leave(future)
                    raise
                if result != "admitted":
                    outcomes[{"timeout": "timeouts"}.get(result, result)] += 1
                    return
            else:
                await limit.acquire()
            admitted = True
            outcomes["admitted"] += 1
            # The held section runs to its end even if this task is cancelled meanwhile, so
            # the witness is back down before the slot is released.
            section = asyncio.ensure_future(witnessed(witness, config["key"], held_for, seen))
            try:
                await asyncio.shield(section)
            except asyncio.CancelledError:
                await section
                raise
            finally:
                limit.release()
        except TimeoutError:
            outcomes["timeouts"] += 1
        except QueueFullError:
            outcomes["shed"] += 1
        except LimitUnavailableError:
            outcomes["unavailable"] += 1
        except asyncio.CancelledError:
            if not admitted:
                outcomes["cancelled"] += 1

    tasks = []
    started = time.monotonic()
    while time.monotonic() - started < config["seconds"]:
        task = asyncio.create_task(one(rng.uniform(0.0, 0.03), rng.choice(("enqueue", "acquire"))))
        tasks.append(task)
        if rng.random() < 0.2:  # the client goes away, queued or not
            asyncio.get_running_loop().call_later(rng.uniform(0, 0.1), task.cancel)
        await asyncio.sleep(rng.expovariate(config["rate"]))
    await asyncio.gather(*tasks, return_exceptions=True)
    return {"arrived": len(tasks), "outcomes": outcomes, "max_witness": max(seen, default=0)}


async def budget(
    limit: SharedLimit, client: aioredis.Redis, witness: aioredis.Redis, config: dict[str, Any]
) -> dict[str, Any]:
    async def one() -> str:
        waiter = limit.enqueue(tokens=config["tokens"])
        admission = await waiter
        reservation = limit.settle(waiter)
        if admission == "admitted":
            assert reservation is not None
            reservation.settle(config["used"])
            limit.release()
        return admission

    outcomes = await asyncio.gather(*(one() for _ in range(config["requests"])))
    return {"outcomes": sorted(outcomes), "budget_refused": limit.admission_budget}


ROLES = {"flood": flood, "hold": hold, "wait": wait, "soak": soak, "budget": budget}

if __name__ == "__main__":
    result = asyncio.run(main(json.loads(sys.argv[1])))
    print(json.dumps(result), flush=True)
