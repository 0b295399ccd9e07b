"""The rollout driver waits out a refused rollout instead of spending one of its attempts.

NeMo Gym 0.7.0's collector writes every non-terminal failure to the failures sidecar, and
resume counts each sidecar row as an attempt (`_load_from_cache`: at
NEMO_GYM_MAX_ROLLOUT_ATTEMPTS, 3, a rollout is never run again). A refusal (an episode never
admitted, or a call inside it refused by a limit before any work) is not a failed attempt: the
server did not run it. Under the opt-in, inside `gym eval run`'s collection, a `/run` reply that
is a refusal is posted again after a short backoff (50 ms doubling to 1 s, jittered), the
rollout keeping its `rollouts` slot, until the episode runs or REFUSED_WAIT_VARIABLE seconds
(600 by default; 0: never) have passed since its first refusal; only then is the refusal
returned to the collector, as one non-terminal attempt.

A refusal is a non-terminal `failure` at stage `admission` (NeMo Gym's own "Episode admission
timed out", or this project's `episode` profile), or one whose `failure_kind` is this project's
(`gym_concurrency:...`, from `refusals_as_episode_failures` or the opt-in's environment servers).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import random
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

__all__ = ["REFUSED_WAIT_VARIABLE", "collecting", "is_refusal", "waiting_post"]

REFUSED_WAIT_VARIABLE = "GYM_CONCURRENCY_NEMO_GYM_REFUSED_WAIT_SECONDS"
DEFAULT_WAIT_SECONDS = 600.0
FIRST_BACKOFF, MAX_BACKOFF = 0.05, 1.0
_LOGGER = logging.getLogger("gym_concurrency.nemo_gym")
_COLLECTING: ContextVar[bool] = ContextVar("gym_concurrency.nemo_gym.collecting", default=False)
_posted_again: list[int] = [0]  # refused rollouts posted again in this process


def is_refusal(reply: Any) -> bool:
    """Whether an episode reply (parsed JSON) is a refusal: the episode was not run."""
    failure = reply.get("failure") if isinstance(reply, dict) else None
    if not isinstance(failure, dict) or failure.get("terminal") is not False:
        return False
    kind = failure.get("failure_kind")
    return failure.get("stage") == "admission" or (
        isinstance(kind, str) and kind.startswith("gym_concurrency:")
    )


@contextmanager
def collecting() -> Iterator[None]:
    """Within it (a collection of `gym eval run`), `/run` replies that are refusals wait."""
    _wait_seconds()  # a bad value ends the run here, before any rollout is sent
    token = _COLLECTING.set(True)
    before = _posted_again[0]
    try:
        yield
    finally:
        _COLLECTING.reset(token)
        again = _posted_again[0] - before
        if again:
            _LOGGER.info(
                "gym_concurrency: the rollout driver posted %d refused rollouts again (their "
                "servers refused them before running them; no attempt was spent)",
                again,
            )


def waiting_post(
    post: Callable[..., Awaitable[Any]],
) -> Callable[..., Awaitable[Any]]:
    """`ServerClient.post`, whose `/run` posts during a collection wait out refusals."""

    @functools.wraps(post)
    async def post_waiting(self: Any, server_name: str, url_path: str, **kwargs: Any) -> Any:
        reply = await post(self, server_name=server_name, url_path=url_path, **kwargs)
        if url_path != "/run" or not _COLLECTING.get():
            return reply
        budget = _wait_seconds()
        loop = asyncio.get_running_loop()
        until, backoff = loop.time() + budget, FIRST_BACKOFF
        while reply.status == 200 and await _refused(reply):
            pause = backoff * random.uniform(0.5, 1.0)  # jitter
            if loop.time() + pause > until:
                return reply  # the collector records it: one non-terminal attempt
            if _posted_again[0] == 0:
                _LOGGER.info(
                    "gym_concurrency: %s refused a rollout; the driver posts it again after a "
                    "backoff instead of spending an attempt, for up to %g s (%s)",
                    server_name,
                    budget,
                    REFUSED_WAIT_VARIABLE,
                )
            _posted_again[0] += 1
            reply.release()
            await asyncio.sleep(pause)
            backoff = min(backoff * 2, MAX_BACKOFF)
            reply = await post(self, server_name=server_name, url_path=url_path, **kwargs)
        return reply

    return post_waiting


async def _refused(reply: Any) -> bool:
    body = await reply.read()  # aiohttp keeps it: the collector reads the same bytes after
    if b'"failure"' not in body or b'"terminal"' not in body:
        return False
    try:
        return is_refusal(json.loads(body))
    except ValueError:  # not JSON: the collector says so itself
        return False


def _wait_seconds() -> float:
    raw = os.environ.get(REFUSED_WAIT_VARIABLE)
    if raw is None or not raw.strip():
        return DEFAULT_WAIT_SECONDS
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if seconds < 0 or seconds != seconds:
        raise ValueError(f"{REFUSED_WAIT_VARIABLE} must be a number of seconds >= 0, got {raw!r}")
    return seconds
