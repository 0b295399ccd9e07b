"""benchmarks/shared_cost.py in its --quick mode, as a smoke test: it runs to its summary on a
redis-server of its own, and every figure is a positive number. The contract's cost goals
are not asserted (CI machines vary); what holds on any machine is: a shared limit calls Redis
on every admission (script calls and commands > 0), a process limit never does."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ("client_cpu_us", "wall_us", "script_calls", "redis_commands", "redis_cpu_us")


def test_the_shared_cost_benchmark_runs(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "benchmarks.shared_cost", "--quick", "--out", str(tmp_path)]
    command += ["--baseline", str(ROOT)]  # the same tree: the before / after mechanism runs
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "shared-cost.summary.json").read_text())
    assert (tmp_path / "shared-cost.json").exists()
    modes = ("uncontended", "contended", "contended-3proc")
    configs = ("process", "shared", "shared-baseline")
    assert set(summary["cells"]) == {f"{c}/{m}" for c in configs for m in modes}
    for name, cell in summary["cells"].items():
        assert cell["rounds"] == 1
        for figure in FIGURES:
            value = cell[figure]
            assert isinstance(value, float | int), (name, figure)
            assert math.isfinite(value), (name, figure)
            if name.startswith("shared") or figure in ("client_cpu_us", "wall_us"):
                assert value > 0, (name, figure, value)
            else:
                assert value == 0, (name, figure, value)  # no Redis for a process limit
    for mode in modes:
        after_over_before = summary["shared_over_baseline_same_round"][mode]
        assert set(after_over_before) == set(FIGURES)
        assert all(ratio > 0 for ratio in after_over_before.values()), after_over_before
        assert (
            summary["ratios_to_process_same_round"][f"shared/{mode}"]["client_cpu_us_over_process"]
            > 0
        )
        assert summary["cells"][f"shared/{mode}"]["commands_per_admission"]
    goals = summary["goals"]["shared"]
    assert goals["client_cpu_us/uncontended"]["goal_at_most"] == 250
    assert goals["redis_cpu_us/contended-3proc"]["goal_at_most"] == 80
    assert summary["hiredis"] in (True, False)
    assert "| shared/uncontended |" in done.stdout
