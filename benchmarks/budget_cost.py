"""What a rate budget adds to a MeteredSemaphore's admission, as ratios in the same run.

Run `python -m benchmarks.budget_cost` from the project root (`--quick` for a smoke pass,
`--json PATH` for the raw figures, `--baseline PATH` to time another checkout's budgeted
semaphore beside this tree's: before / after in one run). Each benchmark times the same
admission on a limit without a budget (the baseline) and with a budget of tokens and requests
a minute too large to ever refuse (so every admission charges the budget, and none waits for
it), and, where the caller settles, through `hold()` with a usage:

- uncontended: `async with sem: pass` in one task, every acquire finds a free slot;
- contended: 64 tasks on 8 slots, the body awaits once (core.py's 1b);
- request: a chat completion through the middleware in process (ASGI, no network), the
  route's tokens estimated from its JSON body and settled from the usage its answer reports
  (what a budget adds: the body and the answer read as they pass), against the same route
  without a budget.

The design's goal is a budgeted admission within 1.3x the same admission without.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the project root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fastapi import FastAPI, Request
from gym_concurrency.middleware import ConcurrencyLimitMiddleware, ConcurrencySettings, RouteLimit

from benchmarks._baseline import load as load_baseline
from benchmarks._timing import Case, Settings, compare, markdown_table, now_ns
from benchmarks.core import contended, machine, metered, uncontended
from benchmarks.middleware_inprocess import driver
from gym_concurrency import MeteredSemaphore
from gym_concurrency.limits.rate_budget import RateBudget

LARGE = 10**15  # a minute's budget no benchmark spends


def budget() -> RateBudget:
    return RateBudget(tokens_per_minute=LARGE, requests_per_minute=LARGE)


def budgeted(slots: int) -> MeteredSemaphore:
    """The semaphore under test: `slots` slots and a budget that never refuses."""
    return MeteredSemaphore(slots, budget=budget())


def uncontended_settled(make: Callable[[int], MeteredSemaphore]) -> Callable[[int], Awaitable[int]]:
    """n `async with sem.hold(tokens=500) as held: held.settle(300)` in one task (one slot)."""

    async def run(n: int) -> int:
        sem = make(1)
        started = now_ns()
        for _ in range(n):
            async with sem.hold(tokens=500) as held:
                held.settle(300)
        return now_ns() - started

    return run


CHAT = json.dumps(
    {"messages": [{"role": "user", "content": "x" * 396}], "max_tokens": 200}
).encode()  # (100 tokens of prompt at 4 characters a token)
SCOPE = {
    "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
    "scheme": "http", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
    "root_path": "", "query_string": b"", "server": ("bench", 80), "client": ("127.0.0.1", 1),
    "headers": [(b"host", b"bench"), (b"content-type", b"application/json")],
}  # fmt: skip


def chat_app(budgeted: bool) -> ConcurrencyLimitMiddleware:
    """A chat route answering its usage, limited (never binding), with or without a budget."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def completions(request: Request) -> dict[str, object]:
        await request.body()
        return {"choices": [], "usage": {"prompt_tokens": 100, "completion_tokens": 20}}

    budget: dict[str, object] = {}
    if budgeted:  # (the estimate's rule needs a token budget)
        budget = {
            "tokens_per_minute": LARGE,
            "requests_per_minute": LARGE,
            "tokens": "openai_tokens",
        }
    route = RouteLimit(
        path="/v1/chat/completions", limit_name="chat", max_concurrent=1_000_000, **budget
    )
    settings = ConcurrencySettings(component=f"budget-cost-{budgeted}", routes=[route])
    return ConcurrencyLimitMiddleware(app, settings=settings)


def requests(budgeted: bool) -> Callable[[int], Awaitable[int]]:
    """n sequential chat completions through `chat_app(budgeted)`; every one must answer 200."""
    run: Callable[[int], Awaitable[int]] = driver(chat_app(budgeted), SCOPE, CHAT)
    return run


# core.py's `async with` benchmarks, on one slot and on 8 (64 tasks); a request in process.
BENCHMARKS = {
    "uncontended": (
        "Uncontended `async with`, one slot: with a budget vs without",
        lambda: [
            Case("without a budget", uncontended(metered)),
            Case("with a budget", uncontended(budgeted)),
            Case("with a budget, hold() + settle", uncontended_settled(budgeted)),
        ],
    ),
    "contended": (
        "Contended: 64 tasks on 8 slots, body awaits once: with a budget vs without",
        lambda: [
            Case("without a budget", contended(metered)),
            Case("with a budget", contended(budgeted)),
        ],
    ),
    "request": (
        "A chat completion through the middleware in process: with a budget vs without",
        lambda: [
            Case("without a budget", requests(False)),
            Case("with a budget", requests(True)),
        ],
    ),
}
TARGET = 1.3


def baseline_cases(name: str, library: Any) -> list[Case]:
    """The budgeted cases of benchmark `name` run on `library`, another tree's gym_concurrency."""

    def theirs(slots: int) -> MeteredSemaphore:
        budget = library.limits.rate_budget.RateBudget(
            tokens_per_minute=LARGE, requests_per_minute=LARGE
        )
        return library.MeteredSemaphore(slots, budget=budget)  # type: ignore[no-any-return]

    if name == "uncontended":
        return [
            Case("with a budget (baseline)", uncontended(theirs)),
            Case("hold() + settle (baseline)", uncontended_settled(theirs)),
        ]
    if name == "contended":
        return [Case("with a budget (baseline)", contended(theirs))]
    return []


async def main(argv: list[str] | None = None) -> int:
    """Print one Markdown table a benchmark; the ratios against the 1.3x goal."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few short rounds (smoke test)")
    parser.add_argument("--rounds", type=int, help="rounds per comparison")
    parser.add_argument("--json", type=Path, help="write the raw figures here")
    parser.add_argument("--baseline", type=Path, help="a checkout to time beside this tree")
    args = parser.parse_args(argv)
    library = None if args.baseline is None else load_baseline(args.baseline)
    settings = Settings.quick() if args.quick else Settings()
    if args.rounds:
        settings = Settings(rounds=args.rounds, min_round_ns=settings.min_round_ns)
    print(f"<!-- {machine()}; rounds={settings.rounds} -->\n", flush=True)
    raw = []
    for name, (title, cases) in BENCHMARKS.items():
        unit = "request" if name == "request" else "acquire"
        chosen = cases() + ([] if library is None else baseline_cases(name, library))
        comparison = await compare(title, chosen, settings, unit=unit)
        print(markdown_table(comparison, {"with a budget": TARGET}), "\n", flush=True)
        raw.append(comparison.to_json())
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(), "results": raw}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
