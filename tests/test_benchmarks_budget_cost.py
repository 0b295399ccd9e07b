"""benchmarks/budget_cost.py, small, as a smoke test: every comparison runs to its table (with
another checkout's budgeted cases beside this tree's under `--baseline`), the budgeted limit it
times really charges its budget, and the request case answers every chat completion through
the middleware. (How much a budget costs is the benchmark's to say, not a test's: the
uncontended case is within 2x of the same without, closer than a loaded machine's noise.)"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from benchmarks.budget_cost import LARGE, budgeted

ROOT = Path(__file__).resolve().parent.parent


def test_the_budget_cost_benchmark_compares_every_case_with_and_without(tmp_path: Path) -> None:
    raw = tmp_path / "budget-cost.json"
    command = [sys.executable, "-m", "benchmarks.budget_cost", "--quick", "--rounds", "2"]
    command += ["--baseline", str(ROOT)]  # this tree again, as another checkout would be
    done = subprocess.run(
        [*command, "--json", str(raw)], cwd=ROOT, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(raw.read_text())["results"]
    titles = [result["title"] for result in results]
    assert [title.split(":")[0] for title in titles] == [
        "Uncontended `async with`, one slot",
        "Contended",
        "A chat completion through the middleware in process",
    ]
    cases = [sorted(result["median_ns"]) for result in results]
    assert cases == [
        sorted(
            [
                "without a budget",
                "with a budget",
                "with a budget, hold() + settle",
                "with a budget (baseline)",
                "hold() + settle (baseline)",
            ]
        ),
        sorted(["without a budget", "with a budget", "with a budget (baseline)"]),
        sorted(["without a budget", "with a budget"]),
    ]
    assert all(ns > 0 for result in results for ns in result["median_ns"].values())
    assert "A chat completion through the middleware" in done.stdout


def test_the_limit_it_times_charges_its_budget() -> None:
    async def main() -> tuple[int, int]:
        sem = budgeted(2)
        for _ in range(5):
            async with sem:  # through the budget's allowance after the first
                pass
        async with sem.hold(tokens=500) as held:
            held.settle(300)
        assert sem.budget is not None
        statistics = sem.budget.statistics()
        assert statistics.tokens is not None
        assert statistics.requests is not None
        return statistics.tokens.remaining, statistics.requests.remaining

    assert asyncio.run(main()) == (LARGE - 5 - 300, LARGE - 6)
