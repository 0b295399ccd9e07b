"""benchmarks/outbound.py, scaled down, as a smoke test: it runs to its summary, and a fixed
limit at the upstream's capacity makes one attempt per call, none before a Retry-After, and
gives every slot back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_outbound_benchmark_runs_and_a_fixed_limit_makes_one_attempt_per_call(
    tmp_path: Path,
) -> None:
    summary = tmp_path / "outbound.summary.json"
    command = [sys.executable, "-m", "benchmarks.outbound", "--calls", "300", "--callers", "64"]
    command += ["--rounds", "1", "--no-outage", "--only", "semaphore32,ours_fixed,ours_adaptive"]
    command += ["--raw", str(tmp_path / "raw.json"), "--summary", str(summary)]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(summary.read_text())
    fixed = figures["ours_fixed"]["steady"]
    assert (fixed["attempts_per_call"], fixed["failed"], fixed["early_attempts"]) == (1.0, 0, 0)
    assert fixed["leaked"] == {"active": 0, "queue_depth": 0}
    adaptive = figures["ours_adaptive"]["steady"]
    assert adaptive["early_attempts"] == 0  # never before the upstream's Retry-After
    assert adaptive["leaked"] == {"active": 0, "queue_depth": 0}
    assert "| ours_fixed | 1.00 |" in done.stdout
