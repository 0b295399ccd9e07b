"""benchmarks/deadlines.py in its --quick mode, as a smoke test: it runs to its summary (uvicorn
and an open-loop client, 4 short cells, ~30 s), and the figures are sane. Issue 26's goals are
not asserted (CI machines vary, and the quick cells end before the limit's rate warm-up is
over); what is asserted holds on any machine: every request sent is accounted for, the app
sees the deadline only on the route that reads it, and without a deadline nothing is refused
before the 2 s queue timeout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_the_deadlines_benchmark_runs(tmp_path: Path) -> None:
    from gym_concurrency.middleware.settings import RouteLimit

    if "deadline" not in RouteLimit.model_fields:
        pytest.skip("this tree's RouteLimit has no deadline setting")
    raw = tmp_path / "deadlines.json"
    command = [sys.executable, "-m", "benchmarks.deadlines", "--quick", "--json", str(raw)]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=100, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(raw.read_text())
    summary = json.loads((tmp_path / "deadlines.summary.json").read_text())["summary"]
    assert set(summary) == {"4x deadline", "4x no-deadline", "16x deadline", "16x no-deadline"}
    assert "| 16x | deadline |" in done.stdout

    for cell in result["cells"]:
        # Every request sent in the window ended one way or another: answered or given up.
        assert sum(cell["outcomes"].values()) == cell["sent"], cell["outcomes"]
        assert cell["run"]["unanswered_at_end"] == 0
        assert cell["run"]["arrivals"] >= cell["sent"] > 0
        rate = cell["flood"] * 160
        assert 0.5 * rate <= cell["sent_per_second"] <= 1.5 * rate, cell["sent_per_second"]

    for name, row in summary.items():
        assert row["admitted"] > 0, name
        assert 0 <= row["in_deadline_fraction_of_best"] <= 1.1, (name, row)
        # The handler sleeps 100 ms; a loaded machine adds up to 120 ms (163-222 ms seen), still
        # far from the 2-s wait a time counted from arrival would add.
        assert 90 <= row["service_mean_ms"] <= 300, (name, row)
        for low, high in (("ok_p50_ms", "ok_p99_ms"), ("refused_p50_ms", "refused_p99_ms")):
            if row[low] is not None and row[high] is not None:
                assert 0 <= row[low] <= row[high], (name, low, row)
        if row["config"] == "deadline":
            assert isinstance(row["started_late_server_view"], int), (name, row)
        else:
            # No deadline on the route: none in request.state, and a queued request is
            # refused only when its 2 s queue timeout ends.
            assert row["started_late_server_view"] is None, (name, row)
            if row["refused_per_second"] > 0:
                assert row["refused_p50_ms"] >= 1900, (name, row)
