"""benchmarks/budget_cost.py, small, as a smoke test: every comparison runs to its table, a
budgeted case costs more than the same case without (a budget is never free), and the request
case answers every chat completion through the middleware."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_budget_cost_benchmark_compares_every_case_with_and_without(tmp_path: Path) -> None:
    raw = tmp_path / "budget-cost.json"
    command = [sys.executable, "-m", "benchmarks.budget_cost", "--quick", "--rounds", "2"]
    done = subprocess.run(
        [*command, "--json", str(raw)], cwd=ROOT, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(raw.read_text())["results"]
    titles = [result["title"] for result in results]
    assert [title.split(":")[0] for title in titles] == [
        "Uncontended `async with`, one slot",
        "Contended",
        "A chat completion through the middleware in process",
    ]
    for result in results:
        assert result["median_ns"]["with a budget"] > result["median_ns"]["without a budget"]
    assert "A chat completion through the middleware" in done.stdout
