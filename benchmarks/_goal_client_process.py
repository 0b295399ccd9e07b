"""What a goal run's client process (benchmarks/_engine_client.py, _rate_budget_client.py)
does the same: the options the driver gives every one (`--expect`, `--source`, a `--url` on
127.0.0.1), a chat completion call counted as it ended, and the run itself on asyncio's own
loop with gym_concurrency from the tree measured, its result one JSON line on stdout.

Nothing here imports gym_concurrency: `use_source_tree` must come first.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from benchmarks._source import PROJECT_ROOT, loaded_files, use_source_tree

if TYPE_CHECKING:
    import aiohttp
    import httpx

__all__ = ["chat_completion", "chat_completion_aiohttp", "client_arguments", "run_client"]

HEADERS = {"content-type": "application/json"}


def client_arguments(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """Add `--expect` and `--source` to `parser` and parse; exits unless `--url` (the caller's
    option) is on 127.0.0.1."""
    parser.add_argument("--expect", default="", help="budget,engine: what the limit must have")
    parser.add_argument("--source", default=str(PROJECT_ROOT), help="the tree to measure")
    args = parser.parse_args()
    if not args.url.startswith("http://127.0.0.1:"):
        sys.exit("--url must be on 127.0.0.1")
    return args


async def chat_completion(client: httpx.AsyncClient, body: bytes, failed: Counter[str]) -> bool:
    """POST `body` to /v1/chat/completions; whether it was answered 200. Anything else is
    counted in `failed` by status, or by exception (a limit's refusal, a transport error)."""
    try:
        response = await client.post("/v1/chat/completions", content=body, headers=HEADERS)
    except Exception as error:
        failed[type(error).__name__] += 1
        return False
    return _answered(response.status_code, failed)


async def chat_completion_aiohttp(
    session: aiohttp.ClientSession, body: bytes, failed: Counter[str]
) -> bool:
    """As `chat_completion`, through an aiohttp session; the body read in full."""
    try:
        async with session.post("/v1/chat/completions", data=body, headers=HEADERS) as response:
            await response.read()
    except Exception as error:
        failed[type(error).__name__] += 1
        return False
    return _answered(response.status, failed)


def _answered(status: int, failed: Counter[str]) -> bool:
    """True for 200; else counted in `failed` by status."""
    if status != 200:
        failed[str(status)] += 1
    return status == 200


def run_client(
    args: argparse.Namespace,
    run: Callable[[argparse.Namespace], Coroutine[Any, Any, dict[str, Any]]],
) -> None:
    """`run(args)` with gym_concurrency from `--source` (failing if any module came from
    elsewhere), printed as one JSON line."""
    # asyncio's own loop: its time() is time.monotonic(), the clock an engine signal and a
    # rate budget read.
    root = use_source_tree(args.source)
    result = asyncio.run(run(args))
    loaded_files(root)  # fails if any gym_concurrency module came from elsewhere
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
