"""A long life of distinct flows: do the per-flow series stay named, and does memory stay flat?

Issue 33: after ~2,000 distinct flows in a process's life, the SDK's cardinality limit turned
every `gym_concurrency_flow_*` series into `otel_metric_overflow="true"` (no limit name), and
memory grew with the flows ever seen. Here `--flows` distinct flows (100,000 by default: the
issue's hour, compressed into `--flows / --per-cycle` exports) go through 4 limits in one
process with a real SDK MeterProvider, each cycle's flows holding or queueing while one export
is read (benchmarks/_flow_series_worker.py, one fresh process per cell). Cells:

    <tree> <reader>   the flow series as the tree makes them, read through a
                      PrometheusMetricReader scrape (`prometheus`) or an InMemoryMetricReader
                      collection (`memory`)
    control           this tree, `set_flow_series_per_limit(0)`: no flow series at all (the
                      harness's own memory: tasks, scrapes)

Reported per cell: exports whose flow series overflowed, lost their limit name, missed a steady
tenant's named series or did not sum to the limit's `active`; the flow labels ever exported;
RSS (after gc) growth from the start (tenants in, one export, no cycle yet) and from the end of
the first tenth (the bounded label set in: what grows after it grows with flows); the export's
p50 time. Goal: no bad export, RSS within 2 MiB of its start.

    .venvs/3.11/bin/python -m benchmarks.flow_series [--flows 100000] [--per-cycle 100]
        [--baseline TREE] [--readers prometheus,memory] [--label NAME]

A baseline tree: `git archive <commit> gym_concurrency middleware | tar -x -C /tmp/before`.
Writes benchmarks/results/flow-series-LABEL.json (raw, with the RSS samples; not kept in git)
and flow-series-LABEL.summary.json, prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the project root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._source import PROJECT_ROOT

RESULTS = PROJECT_ROOT / "benchmarks" / "results"
SUMMARY_FIELDS = (
    "flows",
    "exports",
    "bad_exports",
    "first_bad_export",
    "overflow_points",
    "first_overflow_export",
    "flows_at_first_overflow",
    "unnamed_points",
    "tenant_misses",
    "sum_mismatches",
    "distinct_flow_labels_exported",
    "max_flow_series_per_instrument",
    "rss_start_mib",
    "rss_end_mib",
    "rss_growth_mib",
    "rss_growth_after_first_tenth_mib",
    "export_ms_p50",
    "export_ms_max",
    "seconds",
)


def run_cell(
    source: Path, reader: str, args: argparse.Namespace, series: int = 5
) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks._flow_series_worker", "--source", str(source)]
    command += ["--flows", str(args.flows), "--per-cycle", str(args.per_cycle)]
    command += ["--reader", reader, "--series", str(series)]
    done = subprocess.run(
        command, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=3600, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flows", type=int, default=100_000)
    parser.add_argument("--per-cycle", type=int, default=100)
    parser.add_argument("--baseline", type=Path, help="a tree to measure first (before)")
    parser.add_argument("--readers", default="prometheus,memory")
    parser.add_argument("--label", default="after")
    args = parser.parse_args()
    trees = [("before", args.baseline)] if args.baseline else []
    trees.append(("this tree", PROJECT_ROOT))
    cells: dict[str, dict[str, Any]] = {}
    for name, tree in trees:
        for reader in args.readers.split(","):
            cells[f"{name} {reader}"] = run_cell(tree, reader, args)
    cells["control"] = run_cell(PROJECT_ROOT, "prometheus", args, series=0)
    run = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "flows": args.flows,
        "per_cycle": args.per_cycle,
        "cells": cells,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    raw = RESULTS / f"flow-series-{args.label}.json"
    raw.write_text(json.dumps(run, indent=1))
    summary = {
        **{k: v for k, v in run.items() if k != "cells"},
        "cells": {
            name: {
                "tree": cell["tree"]["commit"] or cell["tree"]["path"],
                **{field: cell[field] for field in SUMMARY_FIELDS},
            }
            for name, cell in cells.items()
        },
    }
    (RESULTS / f"flow-series-{args.label}.summary.json").write_text(json.dumps(summary, indent=1))
    print(table(summary["cells"]))


def table(cells: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| cell | bad exports | overflow points | labels ever | RSS growth (MiB) | "
        "after 1st tenth (MiB) | export p50 (ms) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, c in cells.items():
        lines.append(
            f"| {name} | {c['bad_exports']} / {c['exports']} | {c['overflow_points']} | "
            f"{c['distinct_flow_labels_exported']} | {c['rss_growth_mib']:.2f} | "
            f"{c['rss_growth_after_first_tenth_mib']:.2f} | {c['export_ms_p50']:.1f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
