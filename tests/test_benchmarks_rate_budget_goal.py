"""benchmarks/rate_budget_goal.py in a tiny run, as a smoke test: the fake provider, two client
processes released together, today's fixed and AIMD client limits, each to its row of the
summary. The goal itself (0 429s, >= 0.95 of the quota with a global budget) is not asserted:
it needs a 5-minute run. What holds on any machine: the provider served calls and the clients
saw them complete; its 429s are the provider's own count.

A budget configuration, before issue 35's wiring is in the tree, stops at once naming what is
missing; once it is, it runs (a process budget: no Redis needed here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks._goal_parts import missing_wiring
from benchmarks.rate_budget_goal import BUDGET_FIELDS

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--seconds", "4", "--processes", "2", "--callers", "2", "--tpm", "20000"]


def run(tmp_path: Path, configs: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "benchmarks.rate_budget_goal", "--configs", configs]
    command += [*TINY, "--json", str(tmp_path / "rate-budget-goal.json")]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=180)


def test_the_rate_budget_goal_runs_its_baselines(tmp_path: Path) -> None:
    done = run(tmp_path, "fixed,aimd")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| `fixed` |" in done.stdout
    assert "| `aimd` |" in done.stdout
    summary = json.loads((tmp_path / "rate-budget-goal.summary.json").read_text())
    assert set(summary["summary"]) == {"fixed", "aimd"}
    cells = json.loads((tmp_path / "rate-budget-goal.json").read_text())["cells"]
    for cell in cells:
        assert cell["served"] >= 1, cell["config"]
        assert 1 <= cell["completed"] <= cell["served"], cell["config"]
        assert cell["upstream_429"] == sum(cell["refused_by"].values())
        assert 0 < cell["quota_used_run"] <= 1.0, cell["config"]  # a window admits a minute's
        assert cell["p50_s"] <= cell["p95_s"]
        assert len(cell["limits"]) == 2


def test_a_budget_configuration_says_what_wiring_it_needs(tmp_path: Path) -> None:
    done = run(tmp_path, "fixed,budget-local")
    if missing_wiring(BUDGET_FIELDS):
        assert done.returncode != 0
        assert "budget-local needs issue 35's wiring: " in done.stderr, done.stderr[-3000:]
        assert "Traceback" not in done.stderr
        assert not (tmp_path / "rate-budget-goal.json").exists()  # nothing was started
    else:
        assert done.returncode == 0, done.stderr[-3000:]
        assert "| `budget-local` |" in done.stdout
