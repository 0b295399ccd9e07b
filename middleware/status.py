"""The status view: every named concurrency limit now, as JSON or as a self-refreshing HTML page.

Mount it in an app (`app.add_route("/concurrency", ConcurrencyStatusView())` or `app.mount`).
`?format=json` or a client that does not accept HTML gets the JSON snapshot; a browser gets
a page with a bar per limit that re-reads the snapshot every `refresh_seconds`. Each limit
lists its busiest flows (held and queued weight, waiters), the rest summed, and, where it has
them, its rate budgets (remaining of each a minute) and its engine signal's last reading.
"""

from __future__ import annotations

import html
import json
import logging
import math
from importlib import resources
from typing import Any

from starlette.datastructures import Headers, QueryParams
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.types import Receive, Scope, Send

from gym_concurrency.busiest_flows import busiest_flows
from gym_concurrency.limits import FlowStatistics, Limit, registered_limits
from gym_concurrency.limits.adaptive import limiter_of
from gym_concurrency.operations import operation_counts
from gym_concurrency.upstream_view import upstream_statistics

__all__ = ["ConcurrencyStatusView", "status_snapshot"]

_log = logging.getLogger(__name__)
_LimitKey = tuple[str, str, str | None]
_MIN_REFRESH_SECONDS = 0.2
_MAX_REFRESH_SECONDS = 3600.0
_FLOWS_PER_LIMIT = 5


def status_snapshot(flows_per_limit: int = _FLOWS_PER_LIMIT) -> dict[str, Any]:
    """Every named limit alive now (summed per component, limit name and server) with its
    `flows_per_limit` busiest flows, and the operations running or waiting per operation and
    executor."""
    return {"limits": _limit_rows(flows_per_limit), "operations": _operation_rows()}


def _limit_rows(flows_per_limit: int) -> list[dict[str, Any]]:
    rows: dict[_LimitKey, dict[str, Any]] = {}
    flows: dict[_LimitKey, list[FlowStatistics]] = {}
    for limit in registered_limits():
        try:
            reading = _reading(limit)
            found = limit.flow_statistics()
        except Exception:  # one limit that cannot be read must not take the view down
            _log_unreadable(limit)
            continue
        key = (reading["component"], reading["limit_name"], reading["server"])
        row = rows.get(key)
        if row is None:
            rows[key] = reading
            flows[key] = list(found)
        elif reading.get("scope") != "global":  # same attributes: one limit, as in the metrics
            for field in _SUMMED:
                row[field] += reading[field]
            flows[key] += found
    for key, row in rows.items():
        row.update(_flow_fields(flows[key], flows_per_limit))
    return list(rows.values())


_SUMMED = (
    "limit",
    "active",
    "available",
    "queue_depth",
    "queued_weight",
    "timeouts",
    "cancelled",
    "shed",
)


def _flow_fields(flows: list[FlowStatistics], top: int) -> dict[str, Any]:
    """`flows`: the `top` busiest flows by held + queued weight (labels cut to 64 characters,
    the default flow as "default"); `other_flows`: the rest summed, with their number."""
    busiest = busiest_flows(flows, top)
    rest = busiest.rest
    return {
        "flows": [
            {
                "flow": row.flow,
                "held": row.held,
                "queue_depth": row.queue_depth,
                "queued_weight": row.queued_weight,
            }
            for row in busiest.top
        ],
        "other_flows": None
        if rest is None
        else {
            "flows": busiest.rest_flows,
            "held": rest.held,
            "queue_depth": rest.queue_depth,
            "queued_weight": rest.queued_weight,
        },
    }


def _reading(limit: Limit) -> dict[str, Any]:
    """One limit's row, read in full before it joins the snapshot (a failing read raises)."""
    stats = limit.statistics()
    row: dict[str, Any] = {
        "component": str(limit.component),
        "limit_name": str(limit.limit_name),
        "server": limit.server,
        "limit": stats.limit,
        "active": stats.active,
        "available": stats.available,
        "queue_depth": stats.queue_depth,
        "queued_weight": stats.queued_weight,
        "timeouts": stats.admission_timeouts,
        "cancelled": stats.admission_cancelled,
        "shed": stats.admission_shed,
        "timeout_seconds": limit.timeout,
        "max_queue": limit.max_queue,
    }
    shared = stats.shared
    if shared is not None:
        # `limit` is the global size, `active` / `queue_depth` this process's share, `global`
        # the state across every process as last seen (numbers kept in process: no Redis call).
        row["scope"] = "global"
        row["global"] = {
            "active": shared.active,
            "queue_depth": shared.queue_depth,
            "connected": shared.connected,
        }
        row["unavailable"] = stats.admission_unavailable
    row.update(_upstream_fields(limit))
    limiter = limiter_of(limit)
    if limiter is not None:  # a limit that moves: its bounds, and what it reads
        controller = limiter.controller
        baseline = controller.baseline
        row["adaptive"] = {
            "algorithm": controller.algorithm,
            "min": controller.min_limit,
            "max": controller.max_limit,
            "baseline_ms": None if baseline is None else round(baseline * 1000.0, 3),
        }
    return row


def _upstream_fields(limit: Limit) -> dict[str, Any]:
    """A limit's budgets (each one's size a minute, what admission may take now, reserved,
    the provider's last word) and its engine's last reading, where it has them."""
    budgets, engine = upstream_statistics(limit)
    fields: dict[str, Any] = {}
    if budgets is not None:
        fields["budgets"] = [
            {
                "budget": b.budget,
                "limit": b.limit,
                "remaining": b.remaining,
                "reserved": b.reserved,
                "refunded_total": b.refunded_total,
                "reported_remaining": b.reported_remaining,
            }
            for b in budgets.budgets()
        ]
    if engine is not None:
        fields["engine"] = {
            "waiting": engine.waiting,
            "cache_usage": engine.cache_usage,
            "signal_age_seconds": engine.signal_age_seconds,
            "stale": engine.stale,
        }
    return fields


_unreadable_logged: set[int] = set()


def _log_unreadable(limit: object) -> None:
    if id(limit) not in _unreadable_logged:
        _unreadable_logged.add(id(limit))
        _log.exception("gym_concurrency: the status view cannot read %r; leaving it out", limit)


def _operation_rows() -> list[dict[str, Any]]:
    return [
        {"operation": operation, "executor": executor, "queued": queued, "active": active}
        for (operation, executor), (queued, active) in sorted(operation_counts().items())
    ]


class ConcurrencyStatusView:
    """ASGI endpoint: GET/HEAD answers with the status snapshot (JSON) or page (HTML)."""

    def __init__(
        self,
        *,
        refresh_seconds: float = 1.0,
        title: str = "Concurrency limits",
        flows_per_limit: int = _FLOWS_PER_LIMIT,
    ) -> None:
        if not (_MIN_REFRESH_SECONDS <= refresh_seconds <= _MAX_REFRESH_SECONDS):
            raise ValueError(
                f"refresh_seconds must be between {_MIN_REFRESH_SECONDS} and "
                f"{_MAX_REFRESH_SECONDS}, got {refresh_seconds!r}"
            )
        if isinstance(flows_per_limit, bool) or not isinstance(flows_per_limit, int):
            raise TypeError(f"flows_per_limit must be an int, got {flows_per_limit!r}")
        if flows_per_limit < 0:
            raise ValueError(
                f"flows_per_limit must be >= 0 (0: only their sum), got {flows_per_limit}"
            )
        self.refresh_seconds = refresh_seconds
        self.flows_per_limit = flows_per_limit
        self.title = title
        self._template = resources.files(__package__).joinpath("status.html").read_text("utf-8")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            raise ValueError(f"ConcurrencyStatusView serves HTTP only, not {scope['type']!r}")
        response = self._respond(scope)
        await response(scope, receive, send)

    def _respond(self, scope: Scope) -> Response:
        if scope["method"] not in ("GET", "HEAD"):
            return PlainTextResponse("Method Not Allowed", 405, headers={"Allow": "GET, HEAD"})
        query = QueryParams(scope.get("query_string", b""))
        wanted = query.get("format") or _negotiated_format(Headers(scope=scope))
        if wanted not in ("json", "html"):
            return PlainTextResponse(f"format must be json or html, got {wanted!r}", 400)
        headers = {"Cache-Control": "no-store"}
        if wanted == "json":
            return JSONResponse(status_snapshot(self.flows_per_limit), headers=headers)
        refresh = _refresh_seconds(query.get("refresh"), self.refresh_seconds)
        if isinstance(refresh, str):
            return PlainTextResponse(refresh, 400)
        return HTMLResponse(self._page(refresh), headers=headers)

    def _page(self, refresh_seconds: float) -> str:
        # The first snapshot is embedded so the bars are there on load, before any refresh.
        # "<" is escaped so that no limit name can end the script element early.
        snapshot = json.dumps(status_snapshot(self.flows_per_limit)).replace("<", "\\u003c")
        return (
            self._template.replace("{{TITLE}}", html.escape(self.title))
            .replace("{{REFRESH_MS}}", str(round(refresh_seconds * 1000)))
            .replace("{{SNAPSHOT}}", snapshot)
        )


def _negotiated_format(headers: Headers) -> str:
    """html for a client that asks for text/html (a browser), json for everyone else."""
    return "html" if "text/html" in headers.get("accept", "") else "json"


def _refresh_seconds(raw: str | None, default: float) -> float | str:
    """The page's refresh interval from `?refresh=`, or an error message naming the bounds."""
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (_MIN_REFRESH_SECONDS <= value <= _MAX_REFRESH_SECONDS):
        return (
            f"refresh must be a number of seconds between {_MIN_REFRESH_SECONDS} and "
            f"{_MAX_REFRESH_SECONDS}, got {raw!r}"
        )
    return value
