"""A bounded load generator: floods one demo endpoint until its limit queues and times out,
then prints what came back (counts per status and failure kind, one body of each).

    python -m examples.fastapi_app.load --path /run --requests 200 --concurrency 200

Bounded in count (at most 2000 requests, 500 at once) and time (--deadline, at most 120 s), and
by default only to this machine (--allow-remote to aim elsewhere).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from typing import Any
from urllib.parse import urlsplit

import httpx

MAX_REQUESTS = 2000
MAX_CONCURRENCY = 500
MAX_DEADLINE_SECONDS = 120.0
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})

BODIES: dict[str, dict[str, Any]] = {
    "/run": {"task": {"prompt": "The answer is 42", "expected": "42"}},
    "/v1/chat/completions": {
        "model": "fake-model",
        "messages": [{"role": "user", "content": "hello"}],
    },
    "/verify": {"response": "42", "expected": "42"},
    "/judge": {"response": "42", "expected": "42"},
}


def kind_of(status: int, body: Any) -> str:
    """A short name for what a response was: ok, or which documented failure."""
    if not isinstance(body, dict):
        return f"{status} non-json"
    failure = body.get("failure")
    if isinstance(failure, dict):
        return f"{status} episode failure: {failure.get('failure_reason')}"
    error = body.get("error")
    if isinstance(error, dict):
        return f"{status} openai error: {error.get('code')}"
    if "type" in body and "title" in body:
        return f"{status} problem: {body.get('title')}"
    return f"{status} ok" if status < 400 else f"{status} error"


async def flood(
    url: str, body: dict[str, Any], requests: int, concurrency: int, deadline: float
) -> dict[str, Any]:
    """Send `requests` POSTs, `concurrency` at a time, stopping at `deadline` seconds."""
    kinds: Counter[str] = Counter()
    samples: dict[str, Any] = {}
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    started = time.monotonic()

    async def one(client: httpx.AsyncClient, index: int) -> None:
        async with gate:
            payload = _numbered(body, index)
            try:
                response = await client.post(url, json=payload)
                parsed: Any = response.json()
                kind = kind_of(response.status_code, parsed)
                sample = {
                    "status": response.status_code,
                    "headers": _headers(response),
                    "body": parsed,
                }
            except (httpx.HTTPError, ValueError) as exc:
                kind, sample = f"client error: {type(exc).__name__}", {"error": str(exc)}
            kinds[kind] += 1
            samples.setdefault(kind, sample)

    async with httpx.AsyncClient(timeout=deadline, limits=limits) as client:
        try:
            async with asyncio.timeout(deadline):
                await asyncio.gather(*(one(client, i) for i in range(requests)))
        except TimeoutError:
            kinds["not sent or unanswered by the deadline"] += requests - sum(kinds.values())
    return {
        "url": url,
        "requests": requests,
        "concurrency": concurrency,
        "seconds": round(time.monotonic() - started, 2),
        "counts": dict(kinds),
        "samples": samples,
    }


def _numbered(body: dict[str, Any], index: int) -> dict[str, Any]:
    """An episode body gets its own episode_id and task_id, so failure rows can be told apart."""
    if "task" not in body:
        return body
    return {
        **body,
        "episode_id": f"episode-{index}",
        "task": {**body["task"], "task_id": f"task-{index}"},
    }


def _headers(response: httpx.Response) -> dict[str, str]:
    wanted = ("content-type", "retry-after")
    return {name: response.headers[name] for name in wanted if name in response.headers}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options; out-of-bounds values are refused with the bound named."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--path", default="/run", choices=sorted(BODIES))
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--deadline", type=float, default=60.0, help="seconds, at most 120")
    parser.add_argument("--allow-remote", action="store_true")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = parser.parse_args(argv)
    if not 1 <= args.requests <= MAX_REQUESTS:
        parser.error(f"--requests must be between 1 and {MAX_REQUESTS}")
    if not 1 <= args.concurrency <= MAX_CONCURRENCY:
        parser.error(f"--concurrency must be between 1 and {MAX_CONCURRENCY}")
    if not 0 < args.deadline <= MAX_DEADLINE_SECONDS:
        parser.error(f"--deadline must be more than 0 and at most {MAX_DEADLINE_SECONDS:g}")
    if urlsplit(args.base_url).hostname not in LOCAL_HOSTS and not args.allow_remote:
        parser.error(f"--base-url {args.base_url} is not this machine; add --allow-remote")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    url = args.base_url.rstrip("/") + args.path
    summary = asyncio.run(
        flood(url, BODIES[args.path], args.requests, args.concurrency, args.deadline)
    )
    if args.json:
        json.dump(summary, sys.stdout, indent=2)
        print()
        return
    print(
        f"{summary['requests']} requests to {url}, {summary['concurrency']} at a time, "
        f"{summary['seconds']} s"
    )
    for kind, count in sorted(summary["counts"].items(), key=lambda item: -item[1]):
        print(f"  {count:5d}  {kind}")
    for kind, sample in summary["samples"].items():
        print(f"\n{kind}:\n{json.dumps(sample, indent=2)}")


if __name__ == "__main__":
    main()
