"""One Prometheus port per process, for servers with several workers.

With `uvicorn --workers N` every worker shares the app's port, so a scrape of `/metrics` there
reaches one worker at random and its counters jump between scrapes. With
`DEMO_METRICS_PORTS=9464-9471` each process serves its own registry on the first free port of
the range instead (on 127.0.0.1, or `DEMO_METRICS_HOST`); Prometheus scrapes every port of the
range, and each worker's series stay apart (its `target_info` carries its service.instance.id).
"""

from __future__ import annotations

import errno
import logging

from prometheus_client import CollectorRegistry, start_http_server

__all__ = ["parse_port_range", "serve_on_a_free_port"]

_log = logging.getLogger(__name__)


def parse_port_range(text: str) -> range:
    """`"9464-9471"` (or one port, `"9464"`) as a range of ports; ValueError naming the text."""
    first, _, last = text.strip().partition("-")
    try:
        low, high = int(first), int(last or first)
    except ValueError:
        raise ValueError(f"DEMO_METRICS_PORTS must be PORT or FIRST-LAST, got {text!r}") from None
    if not (0 < low <= high < 65536):
        raise ValueError(f"DEMO_METRICS_PORTS: {text!r} is not a range of TCP ports")
    return range(low, high + 1)


def serve_on_a_free_port(registry: CollectorRegistry, ports: range, host: str) -> int:
    """Serve `registry` on the first port of `ports` no other process has; the port."""
    for port in ports:
        try:
            start_http_server(port, addr=host, registry=registry)
        except OSError as error:
            if error.errno != errno.EADDRINUSE:
                raise
            continue
        _log.info("metrics of this process on http://%s:%d/metrics", host, port)
        return port
    raise RuntimeError(
        f"DEMO_METRICS_PORTS: every port of {ports.start}-{ports.stop - 1} is taken; "
        "give at least one port per worker"
    )
