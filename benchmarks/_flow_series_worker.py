"""One process's run of benchmarks/flow_series.py: many distinct flows through a few limits,
a real SDK MeterProvider exporting after every cycle, and the process's RSS.

Each limit (a MeteredSemaphore of `--size` weight, component "flow_series") has two steady
tenants ("tenant-<limit>-a", "-b", weight 2 each) and the default flow (weight 1) holding
throughout. Each cycle, `--per-cycle` new flows ("flow-000001", ... never seen before) ask
for weight 1, 2 or 3 in turn, spread over the limits: those that fit hold, the others queue;
then one export (a Prometheus scrape through `PrometheusMetricReader`, or an
`InMemoryMetricReader` collection) is read and checked, and the cycle's flows all pass and
leave. `--flows` flows in all.

Every export is checked: its `gym_concurrency_flow_*` series carry the limit name and no
`otel_metric_overflow`, the steady tenants read their weight under their own name, and a
limit's flows sum to its `active`. Counted, not asserted (the benchmark measures the tree
before the fix too). RSS (resident pages of /proc/self/statm, after `gc.collect()`) at the
start (the steady tenants in, one export made, no cycle yet), every tenth of the run, and at
the end. Prints one JSON object. `--series 0` is the control: no flow series (the harness's
own memory), nothing to check.

    .venvs/3.11/bin/python -m benchmarks._flow_series_worker --flows 100000 [--source TREE]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the project root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._source import PROJECT_ROOT, describe_tree, loaded_files, use_source_tree

MIB = 1024 * 1024
COMPONENT = "flow_series"
COMPONENT_KEY = "nemo.gym.concurrency.component"
FLOW = "nemo.gym.concurrency.flow"
LIMIT_NAME = "nemo.gym.concurrency.limit_name"
OVERFLOW = "otel.metric.overflow"
FLOW_METRICS = (
    "gym.concurrency.flow.held",
    "gym.concurrency.flow.queue_depth",
    "gym.concurrency.flow.queued_weight",
)
Point = tuple[dict[str, Any], float]  # attributes, value
Export = tuple[dict[str, list[Point]], float]  # the flow points, the seconds the export took


def rss_bytes() -> int:
    """This process's resident memory now, after a full collection."""
    gc.collect()
    with open("/proc/self/statm") as statm:
        resident = int(statm.read().split()[1])
    return resident * os.sysconf("SC_PAGE_SIZE")


def prometheus_reader() -> tuple[Any, Callable[[], Export]]:
    """A PrometheusMetricReader and a scrape of prometheus_client's registry (its text made:
    the export's time), as points."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from prometheus_client import REGISTRY, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    names = {name.replace(".", "_"): name for name in FLOW_METRICS}
    keys = {key.replace(".", "_"): key for key in (COMPONENT_KEY, FLOW, LIMIT_NAME, OVERFLOW)}

    def scrape() -> Export:
        found: dict[str, list[Point]] = {name: [] for name in FLOW_METRICS}
        started = time.perf_counter()
        text = generate_latest(REGISTRY).decode()
        took = time.perf_counter() - started
        for family in text_string_to_metric_families(text):
            name = names.get(family.name)
            if name is None:
                continue
            for sample in family.samples:
                labels = {keys.get(k, k): v for k, v in sample.labels.items() if v != ""}
                found[name].append((labels, sample.value))
        return found, took

    return PrometheusMetricReader(), scrape


def memory_reader() -> tuple[Any, Callable[[], Export]]:
    """An InMemoryMetricReader and a collection, as points."""
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()

    def collect() -> Export:
        found: dict[str, list[Point]] = {name: [] for name in FLOW_METRICS}
        started = time.perf_counter()
        data = reader.get_metrics_data()
        took = time.perf_counter() - started
        for resource in data.resource_metrics if data is not None else []:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name in found:
                        found[metric.name] += [
                            (dict(p.attributes or {}), getattr(p, "value", 0.0))
                            for p in metric.data.data_points
                        ]
        return found, took

    return reader, collect


class Checks:
    """What the exports showed, counted over the run."""

    def __init__(self, flow_series: bool) -> None:
        self.flow_series = flow_series  # False: the control, no flow series to check
        self.exports = 0
        self.bad_exports = 0  # any series overflowed or without its limit name
        self.first_bad_export: int | None = None
        self.overflow_points = 0
        self.first_overflow: tuple[int, int] | None = None  # (export, flows seen by then)
        self.unnamed_points = 0
        self.tenant_misses = 0  # a steady tenant not read under its name with its weight
        self.sum_mismatches = 0  # a limit's flows not summing to its active
        self.max_flow_series = 0  # points of one flow instrument in one export
        self.labels_seen: set[str] = set()
        self.export_ms: list[float] = []

    def check(
        self, export: dict[str, list[Point]], took: float, limits: list[Any], flows: int
    ) -> None:
        self.exports += 1
        self.export_ms.append(took * 1000.0)
        bad = False
        for name, points in export.items():
            self.max_flow_series = max(self.max_flow_series, len(points))
            for attributes, _ in points:
                if OVERFLOW in attributes:
                    self.overflow_points += 1
                    self.first_overflow = self.first_overflow or (self.exports, flows)
                    bad = True
                elif LIMIT_NAME not in attributes:
                    self.unnamed_points += 1
                    bad = True
                if name == FLOW_METRICS[0] and FLOW in attributes:
                    self.labels_seen.add(str(attributes[FLOW]))
        if not self.flow_series:
            return
        held: dict[tuple[Any, Any], float] = {}
        for attributes, value in export[FLOW_METRICS[0]]:
            if attributes.get(COMPONENT_KEY) == COMPONENT:
                key = (attributes[LIMIT_NAME], attributes.get(FLOW))
                held[key] = held.get(key, 0.0) + value
        for limit in limits:
            for tenant in ("a", "b"):
                if held.get((limit.limit_name, f"tenant-{limit.limit_name}-{tenant}")) != 2:
                    self.tenant_misses += 1
                    bad = True
            total = sum(v for (name, _), v in held.items() if name == limit.limit_name)
            if total != limit.active:
                self.sum_mismatches += 1
                bad = True
        if bad:
            self.bad_exports += 1
            if self.first_bad_export is None:
                self.first_bad_export = self.exports

    def summary(self) -> dict[str, Any]:
        ordered = sorted(self.export_ms)
        return {
            "exports": self.exports,
            "bad_exports": self.bad_exports,
            "first_bad_export": self.first_bad_export,
            "overflow_points": self.overflow_points,
            "first_overflow_export": self.first_overflow and self.first_overflow[0],
            "flows_at_first_overflow": self.first_overflow and self.first_overflow[1],
            "unnamed_points": self.unnamed_points,
            "tenant_misses": self.tenant_misses,
            "sum_mismatches": self.sum_mismatches,
            "max_flow_series_per_instrument": self.max_flow_series,
            "distinct_flow_labels_exported": len(self.labels_seen),
            "export_ms_p50": round(ordered[len(ordered) // 2], 3),
            "export_ms_max": round(ordered[-1], 3),
        }


async def visit(limit: Any, weight: int, flow: str, gate: asyncio.Event) -> None:
    """One flow's call: hold `weight` (after a wait, if it does not fit) until the gate opens."""
    async with limit.hold(weight, flow):
        await gate.wait()


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from opentelemetry.sdk.metrics import MeterProvider

    import gym_concurrency

    reader, export = prometheus_reader() if args.reader == "prometheus" else memory_reader()
    provider = MeterProvider(metric_readers=[reader])
    gym_concurrency.observe_concurrency(provider)
    gym_concurrency.set_flow_series_per_limit(args.series)
    limits = [
        gym_concurrency.MeteredSemaphore(args.size, component=COMPONENT, limit_name=f"l{i}")
        for i in range(args.limits)
    ]
    for limit in limits:
        for tenant in ("a", "b"):
            await limit.acquire(2, f"tenant-{limit.limit_name}-{tenant}")
        await limit.acquire(1)
    checks = Checks(flow_series=args.series > 0)

    def export_and_check() -> None:
        checks.check(*export(), limits, made)

    made = 0
    export_and_check()
    start = rss_bytes()
    samples = [{"flows": 0, "rss_mib": round(start / MIB, 3)}]
    started = time.perf_counter()
    every = max(1, args.flows // 10)
    while made < args.flows:
        gate = asyncio.Event()
        count = min(args.per_cycle, args.flows - made)
        tasks = []
        for _ in range(count):
            made += 1
            limit = limits[made % len(limits)]
            tasks.append(asyncio.create_task(visit(limit, 1 + made % 3, f"flow-{made:06d}", gate)))
        for _ in range(3):  # every task takes its slot or queues
            await asyncio.sleep(0)
        export_and_check()
        gate.set()
        await asyncio.gather(*tasks)
        if made % every < count or made == args.flows:
            samples.append({"flows": made, "rss_mib": round(rss_bytes() / MIB, 3)})
    seconds = time.perf_counter() - started
    export_and_check()  # the cycles' flows all gone: each reads 0 or has no series
    end = rss_bytes()
    samples.append({"flows": made, "rss_mib": round(end / MIB, 3), "after_last_export": True})
    provider.shutdown()
    return {
        "flows": made,
        "limits": args.limits,
        "per_cycle": args.per_cycle,
        "size": args.size,
        "reader": args.reader,
        "seconds": round(seconds, 2),
        "rss_start_mib": round(start / MIB, 3),
        "rss_end_mib": round(end / MIB, 3),
        "rss_growth_mib": round((end - start) / MIB, 3),
        "rss_peak_growth_mib": round(max(s["rss_mib"] for s in samples) - start / MIB, 3),
        # From the first tenth of the run on: the bounded labels are in, what grows is growth.
        "rss_growth_after_first_tenth_mib": round(end / MIB - samples[1]["rss_mib"], 3),
        "rss_samples": samples,
        **checks.summary(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flows", type=int, default=100_000)
    parser.add_argument("--limits", type=int, default=4)
    parser.add_argument("--per-cycle", type=int, default=200)
    parser.add_argument("--size", type=int, default=48, help="each limit's weight")
    parser.add_argument(
        "--series", type=int, default=5, help="set_flow_series_per_limit (0: the control)"
    )
    parser.add_argument("--reader", choices=("prometheus", "memory"), default="prometheus")
    parser.add_argument("--source", default=str(PROJECT_ROOT), help="the tree to measure")
    args = parser.parse_args()
    root = use_source_tree(args.source)
    result = asyncio.run(run(args))
    loaded_files(root)  # nothing loaded from another tree
    print(json.dumps({**result, "tree": describe_tree(root)}))


if __name__ == "__main__":
    main()
