"""benchmarks/queued_bare.py, small, as a smoke test: it runs to its summary against a baseline
tree (here this same tree), every request is answered, and a request that waits costs the
middleware more than one admitted at once, collector on or off."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_queued_bare_measures_a_waiting_request_against_a_baseline(tmp_path: Path) -> None:
    raw = tmp_path / "queued-bare.json"
    command = [sys.executable, "-m", "benchmarks.queued_bare", "--baseline", str(ROOT)]
    command += ["--rounds", "2", "--repeats", "2", "--queued", "256", "--json", str(raw)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(raw.read_text())
    summary = record["summary"]
    assert set(summary) == {"this", "baseline", "ratio"}
    for tree in ("this", "baseline"):
        assert summary[tree]["extra_ns_gc_off"] > 0, summary
        assert summary[tree]["extra_ns_gc_on"] > 0, summary
    assert len(record["rounds"]["this"]) == 2
    assert "this / baseline" in done.stdout
