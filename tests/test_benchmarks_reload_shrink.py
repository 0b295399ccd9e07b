"""benchmarks/reload_shrink.py, short, as a smoke test: a flood through a real uvicorn server,
the route's limit reloaded mid-flood below its heaviest requests. What holds on any machine is
asserted: the reload applied, requests kept being answered after it, none was left waiting at
the bound, and waiters heavier than the new size were capped and counted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_reload_shrink_benchmark_runs(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "benchmarks.reload_shrink", "--scopes", "process"]
    command += ["--seconds", "2", "--shrink-at", "0.8", "--bound", "10", "--label", "smoke"]
    command += ["--out", str(tmp_path)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-3000:]
    row = json.loads((tmp_path / "reload-shrink-smoke.summary.json").read_text())["scopes"]
    process = row["process"]
    assert process["changes"] == ["route limit 'runs': 16 -> 4, static"]
    assert process["statuses"] == [200]
    assert process["unanswered_at_bound"] == 0
    assert process["answered_after_reload"] > 20
    assert process["admission_capped"] >= 1
