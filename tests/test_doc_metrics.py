"""docs/metrics.md lists every instrument the code defines, and no other, with its Prometheus
name (issue 19, item 5). Before, it said it listed every instrument and left out
`gym.concurrency.admission_unavailable_total`."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from gym_concurrency import names

ROOT = Path(__file__).resolve().parent.parent
METRICS_DOC = ROOT / "docs" / "metrics.md"
SOURCES = [
    *sorted((ROOT / "gym_concurrency").rglob("*.py")),
    *sorted((ROOT / "middleware").rglob("*.py")),
]
# The OpenTelemetry Meter's instrument factories, and the observer's instrument specs (per
# limit, and per flow).
CREATE = {
    *(f"create_{kind}" for kind in ("counter", "up_down_counter", "histogram", "gauge")),
    *(f"create_observable_{kind}" for kind in ("counter", "up_down_counter", "gauge")),
    "_Instrument",
    "_FlowInstrument",
    "_BudgetInstrument",  # upstream_instruments.py
    "_EngineInstrument",
}
ROW = re.compile(r"^\| `(gym\.[a-z_.]+)` \| ([^|]+) \| `([^`]+)` \| `([^`]+)` \|", re.M)


def defined() -> set[str]:
    """The instrument names of gym_concurrency.names: the one place each is named."""
    return {value for key, value in vars(names).items() if key.endswith("_INSTRUMENT")}


def documented() -> dict[str, tuple[str, str, str]]:
    """docs/metrics.md's instrument rows: name -> (kind, unit, Prometheus name)."""
    rows = ROW.findall(METRICS_DOC.read_text())
    assert len(rows) == len({name for name, *_ in rows}), "an instrument listed twice"
    return {name: (kind.strip(), unit, prometheus) for name, kind, unit, prometheus in rows}


def instrument_name_arguments() -> list[tuple[str, ast.expr]]:
    """The name argument of every instrument the code creates: each `meter.create_*(...)`
    call, and each `_Instrument(...)` spec the observer creates its instruments from."""
    found = []
    for source in SOURCES:
        for node in ast.walk(ast.parse(source.read_text())):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called in CREATE:
                found.append((f"{source.relative_to(ROOT)}:{node.lineno}", node.args[0]))
    return found


def test_every_instrument_is_named_in_gym_concurrency_names():
    arguments = instrument_name_arguments()
    assert len(arguments) >= 12  # the observer's 8 specs, the operations' 4, the queue wait's 1
    named = set()
    for where, argument in arguments:
        constant = argument.attr if isinstance(argument, ast.Attribute) else None
        constant = constant or (argument.id if isinstance(argument, ast.Name) else None)
        problem = f"{where}: an instrument named by {ast.unparse(argument)}, not by a constant"
        assert constant is not None, problem
        assert constant.endswith("_INSTRUMENT"), problem
        named.add(getattr(names, constant))
    assert named == defined()  # and every constant names an instrument that is made


def test_docs_metrics_lists_every_instrument_and_no_other():
    listed = documented()
    assert set(listed) - defined() == set(), "listed but not defined"
    assert defined() - set(listed) == set(), "defined but not in docs/metrics.md"


def test_each_listed_prometheus_name_is_the_exporters():
    # The OpenTelemetry Prometheus exporter: dots to underscores; a histogram in ms gets the
    # unit suffix and its _bucket, _sum and _count series; a counter (a monotonic sum) ends in
    # _total, added where its name does not.
    for name, (kind, unit, prometheus) in documented().items():
        base = name.replace(".", "_")
        if kind == "histogram":
            assert unit == "ms", name
            assert prometheus == f"{base}_milliseconds_{{bucket,sum,count}}", name
        elif kind in ("counter", "observable counter") and not base.endswith("_total"):
            assert prometheus == f"{base}_total", name
        else:
            assert prometheus == base, name
