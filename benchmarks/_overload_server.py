"""One benchmark server for benchmarks/overload.py: uvicorn (httptools, uvloop, one process)
serving benchmarks/overload_app.py's app in one configuration, on 127.0.0.1 only.

    python -m benchmarks._overload_server --config q0-problem --port 8123 \
        [--sdk] [--source /tmp/before] [--info info.json]

GYM_BENCH_GC_THRESHOLD (e.g. "10000,50,100") sets the cyclic collector's thresholds before
the server starts, to see how much of a configuration's cost is the collector's.

overload.py starts it under `taskset -c 0`. `--source` loads gym_concurrency from another
source tree; `--info` writes where every gym_concurrency module came from and the versions.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import sys
from pathlib import Path

from benchmarks._source import PROJECT_ROOT, loaded_files, use_source_tree


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--sdk", action="store_true", help="an SDK MeterProvider exporting")
    parser.add_argument("--source", default=str(PROJECT_ROOT))
    parser.add_argument("--info", default=None)
    args = parser.parse_args()

    root = use_source_tree(args.source)
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    import fastapi
    import httptools
    import uvicorn
    import uvloop

    from benchmarks.overload_app import CONFIGS, MAX_CONCURRENT, close_setting, make_app

    config = CONFIGS[args.config]
    provider = None
    if args.sdk:
        from opentelemetry import metrics

        from benchmarks.overload_app import make_sdk_provider

        provider = make_sdk_provider()
        metrics.set_meter_provider(provider)
    app = make_app(config, meter_provider=provider)
    gc_threshold = os.environ.get("GYM_BENCH_GC_THRESHOLD")
    if gc_threshold:
        gc.set_threshold(*(int(n) for n in gc_threshold.split(",")))
    if args.info:
        info = {
            "config": config.name,
            "sdk": args.sdk,
            "python": sys.version.split()[0],
            "fastapi": fastapi.__version__,
            "uvicorn": uvicorn.__version__,
            "uvloop": uvloop.__version__,
            "httptools": httptools.__version__,
            "close_setting": close_setting(),
            "gc_threshold": gc.get_threshold(),
            "gym_concurrency_files": loaded_files(root),
        }
        Path(args.info).write_text(json.dumps(info, indent=1))
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=args.port,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        log_level="error",  # uvicorn warns on every --limit-concurrency refusal otherwise
        access_log=False,
        backlog=4096,
        limit_concurrency=MAX_CONCURRENT if config.limiter == "uvicorn" else None,
    )


if __name__ == "__main__":
    main()
