"""The provisioned Grafana dashboard's PromQL: its expressions and the metric names they read."""

from __future__ import annotations

import json
import re
from typing import Any

from demo_processes import REPO

DASHBOARD = REPO / "deploy" / "grafana" / "dashboards" / "gym-concurrency.json"
_KEYWORDS = frozenset(
    {
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "bool",
        "and",
        "or",
        "unless",
        "offset",
        "inf",
        "nan",
    }
)


def load_dashboard() -> dict[str, Any]:
    value: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return value


def expressions() -> list[str]:
    """Every panel target's PromQL, with Grafana's $__rate_interval made a literal range."""
    return [
        target["expr"].replace("$__rate_interval", "1m")
        for panel in load_dashboard()["panels"]
        for target in panel.get("targets", [])
    ]


def metric_names(expression: str) -> set[str]:
    """The metric names an expression selects (label matchers, groupings and functions aside)."""
    bare = re.sub(r"\{[^}]*\}", " ", expression)
    bare = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", " ", bare)
    bare = re.sub(r"\[[^\]]*\]", " ", bare)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", bare):
        followed_by_call = bare[match.end() :].lstrip().startswith("(")
        if not followed_by_call and match.group() not in _KEYWORDS:
            names.add(match.group())
    return names


def dashboard_metric_names() -> set[str]:
    return set().union(*(metric_names(expr) for expr in expressions()))
