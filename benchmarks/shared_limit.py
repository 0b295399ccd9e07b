"""A global limit's cost, this tree's library against a baseline tree's, interleaved.

    python -m benchmarks.shared_limit --baseline PATH [--rounds 3] [--label NAME]

Each round runs `tests/shared/measure.py` (round trips per admission, uncontended admit +
release, the hand-off between two processes, 100 and 10,000 waiters queued across four
processes: see its docstring) once against the baseline's `gym_concurrency` and once against
this tree's, each on a redis-server of its own. PATH is a checkout of the baseline (e.g. `git
worktree add /tmp/before 208be1d`); the measuring script is always this tree's. Writes the
raw runs and a summary of medians and after / before ratios to `results/`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"

# Figure name -> how to read it from one run of tests/shared/measure.py.
FIGURES: dict[str, Any] = {
    "round_trips_per_admission": lambda r: r["round_trips"]["per_admission"],
    "uncontended_admit_release_us": lambda r: r["round_trips"]["uncontended_admit_release_us"],
    "handoff_p50_ms": lambda r: r["handoff"]["p50_ms"],
    "handoff_p99_ms": lambda r: r["handoff"]["p99_ms"],
    "wall_us_per_admission_100_waiters": lambda r: r["waiters"][0]["wall_us_per_admission"],
    "wall_us_per_admission_10000_waiters": lambda r: r["waiters"][1]["wall_us_per_admission"],
    "redis_cpu_us_per_admission_100_waiters": lambda r: r["waiters"][0][
        "redis_cpu_us_per_admission"
    ],
    "redis_cpu_us_per_admission_10000_waiters": lambda r: r["waiters"][1][
        "redis_cpu_us_per_admission"
    ],
    "redis_bytes_for_10000_waiters": lambda r: (
        r["waiters"][1]["redis_used_memory_bytes"] - r["redis_used_memory_empty_bytes"]
    ),
}


def measure(library: Path) -> dict[str, Any]:
    """One run of this tree's measuring script against `library`'s gym_concurrency."""
    with tempfile.TemporaryDirectory() as folder:
        # Only the package comes from `library`: the working folder is first on sys.path
        # (also in the processes the script spawns), ahead of this tree, whose tests/ hold
        # the script.
        (Path(folder) / "gym_concurrency").symlink_to(library / "gym_concurrency")
        done = subprocess.run(
            [sys.executable, "-m", "tests.shared.measure"],
            cwd=folder,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=600,
            check=True,
        )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--label", default="shared-limit")
    args = parser.parse_args()
    baseline = args.baseline.resolve()
    if not (baseline / "gym_concurrency").is_dir():
        parser.error(f"--baseline {baseline} has no gym_concurrency package")
    runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    for round_ in range(args.rounds):
        for name, library in (("before", baseline), ("after", ROOT)):
            runs[name].append(measure(library))
            print(f"round {round_ + 1}: {name} done", file=sys.stderr)
    medians = {
        name: {figure: statistics.median(read(r) for r in rs) for figure, read in FIGURES.items()}
        for name, rs in runs.items()
    }
    summary = {
        "baseline": str(baseline),
        "rounds": args.rounds,
        "python": sys.version.split()[0],
        "redis": runs["after"][0]["redis"],
        "before": medians["before"],
        "after": medians["after"],
        "after_over_before": {
            figure: medians["after"][figure] / medians["before"][figure]
            for figure in FIGURES
            if medians["before"][figure]
        },
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.label}.json").write_text(json.dumps(runs, indent=2))
    (RESULTS / f"{args.label}.summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
