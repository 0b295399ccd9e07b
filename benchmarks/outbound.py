"""Outbound calls under a fixed-capacity upstream: attempts, goodput, failures and latency per
client, then a 20 s outage and the recovery after it.

The upstream (benchmarks/outbound_upstream.py, real uvicorn, pinned to CPU 0) serves 32 calls
at once for 20-50 ms each and answers 429 + `Retry-After: 1` above that. Each configuration
runs in a child process pinned to CPU 1 (two for the global limit): 512 caller tasks make
5,000 logical calls between them, each taking the next call as soon as its last ended.

    nemo_gym        NeMo Gym 0.7.0's own NeMoGymAsyncOpenAI (internal=True: 429/503 retried
                    after 0.5 s, without bound), no limit
    openai_default  openai.AsyncOpenAI with its default retries (max_retries=2), no limit
    semaphore32     the machine's ceiling for any limit at capacity: asyncio.Semaphore(32) around
                    plain aiohttp, no retries (none needed: it never exceeds the capacity)
    semaphore64     asyncio.Semaphore(64) around NeMoGymAsyncOpenAI, as NeMo Gym's judges do
    ours_fixed      aiohttp + limited_middleware(MeteredSemaphore(32), retry=RetryPolicy())
    ours_adaptive   the same, limit starting at 128, adaptive=GradientController(1, 256)
    ours_global     the same with SharedLimit(32) on redis-server, across two processes

Then each runs again closed-loop for 35 s while the upstream is down (503 at once, no
Retry-After) from 5 s to 25 s; a caller whose call failed waits 1 s before its next call (the
same application pause for every client). Reported: attempts/s from 10 s into the outage on
(first attempts and retries apart) and the seconds from recovery until goodput over 1 s is
back at >= 0.95x what it was before the outage.

    python -m benchmarks.outbound [--calls 5000] [--callers 512] [--rounds 2] [--only A,B]
        [--no-outage] [--raw results/outbound.json] [--summary results/outbound.summary.json]

Everything talks to 127.0.0.1 only; each run is bounded in time (a few minutes in all).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
ROOT = Path(__file__).resolve().parent.parent
CONFIGS = (
    "semaphore32",
    "nemo_gym",
    "openai_default",
    "semaphore64",
    "ours_fixed",
    "ours_adaptive",
    "ours_global",
)
OURS = frozenset({"ours_fixed", "ours_adaptive", "ours_global"})
CAPACITY = 32
HEALTHY, DOWN, BACK = 5.0, 20.0, 10.0  # the outage run's phases, seconds
FAILED_CALL_PAUSE = 1.0
STEP = 0.25  # seconds between the 1 s windows that look for the recovery
BODY = {"model": "m", "messages": [{"role": "user", "content": "grade this"}]}


# --- the child: one configuration's callers -----------------------------------------------


async def _caller_factory(config: str, url: str, redis_url: str | None) -> tuple[Any, Any, Any]:
    """(call(call_id) -> ok, the limit or None, close())."""
    if config in ("nemo_gym", "semaphore64"):
        from nemo_gym.openai_utils import NeMoGymAsyncOpenAI
        from nemo_gym.server_utils import GlobalAIOHTTPAsyncClientConfig, set_global_aiohttp_client

        set_global_aiohttp_client(GlobalAIOHTTPAsyncClientConfig())
        client = NeMoGymAsyncOpenAI(base_url=url + "/v1", api_key="none", internal=True)
        semaphore = asyncio.Semaphore(64) if config == "semaphore64" else None

        async def nemo_call(call_id: str) -> bool:
            if semaphore is None:
                await client.create_chat_completion(**BODY, user=call_id)
                return True
            async with semaphore:
                await client.create_chat_completion(**BODY, user=call_id)
                return True

        return nemo_call, None, _nothing
    if config == "openai_default":
        import openai

        oai = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=2)

        async def openai_call(call_id: str) -> bool:
            await oai.chat.completions.create(**BODY, user=call_id)
            return True

        return openai_call, None, oai.close
    import aiohttp

    if config == "semaphore32":
        bare = aiohttp.ClientSession(base_url=url, connector=aiohttp.TCPConnector(limit=0))
        gate = asyncio.Semaphore(32)

        async def bare_call(call_id: str) -> bool:
            async with gate, bare.post("/v1/chat/completions", json={**BODY, "user": call_id}) as r:
                await r.read()
                if r.status != 200:
                    raise RuntimeError(f"status {r.status}")
                return True

        return bare_call, None, bare.close

    from gym_concurrency import MeteredSemaphore, SharedLimit
    from gym_concurrency.clients import RetryPolicy, limited_middleware
    from gym_concurrency.limits.adaptive import GradientController

    limit: Any
    adaptive = None
    if config == "ours_global":
        assert redis_url is not None
        limit = SharedLimit(32, redis_url=redis_url, key="outbound-bench", limit_name="judge")
        await limit.connect()
    elif config == "ours_adaptive":
        limit = MeteredSemaphore(128, component="bench", limit_name="judge")
        adaptive = GradientController(1, 256, 128)
    else:
        limit = MeteredSemaphore(32, component="bench", limit_name="judge")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()  # retries and denials by reason (recorded only on those)
    provider = MeterProvider(metric_readers=[reader])
    middleware = limited_middleware(
        limit, retry=RetryPolicy(), adaptive=adaptive, meter_provider=provider
    )
    limit.reader = reader  # type: ignore[union-attr]  # read by _child at the end
    session = aiohttp.ClientSession(
        base_url=url,
        middlewares=(middleware,),
        connector=aiohttp.TCPConnector(limit=0),  # the limit bounds, not the pool
    )

    async def ours_call(call_id: str) -> bool:
        async with session.post("/v1/chat/completions", json={**BODY, "user": call_id}) as r:
            await r.read()
            if r.status != 200:
                raise RuntimeError(f"status {r.status}")
            return True

    async def close() -> None:
        await session.close()
        if isinstance(limit, SharedLimit):
            await limit.close()

    return ours_call, limit, close


async def _nothing() -> None:
    return None


async def _child(args: argparse.Namespace) -> dict[str, Any]:
    call, limit, close = await _caller_factory(args.child, args.url, args.redis_url)
    latencies: list[float] = []
    failures = 0
    kinds: dict[str, int] = {}  # why calls failed
    next_call = 0
    prefix = f"{args.child}-{os.getpid()}-"
    deadline = None if args.mode == "steady" else time.monotonic() + args.seconds

    async def one(call_id: str) -> bool:
        nonlocal failures
        started = time.monotonic()
        try:
            ok = await call(call_id)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            ok = False
            kind = str(error) if isinstance(error, RuntimeError) else type(error).__name__
            kinds[kind] = kinds.get(kind, 0) + 1
        if ok:
            latencies.append(time.monotonic() - started)
        else:
            failures += 1
        return ok

    async def caller() -> None:
        nonlocal next_call
        while deadline is not None or next_call < args.calls:
            next_call += 1
            if not await one(f"{prefix}{next_call}") and deadline is not None:
                await asyncio.sleep(FAILED_CALL_PAUSE)

    sizes: list[int] = []  # the limit every 20 ms (it moves in ours_adaptive)

    async def sample_size() -> None:
        while limit is not None:
            sizes.append(limit.limit)
            await asyncio.sleep(0.02)

    sampler = asyncio.create_task(sample_size())
    print("started", file=sys.__stdout__, flush=True)  # (NeMo Gym's prints go to devnull)
    cpu = time.process_time()
    started = time.monotonic()
    tasks = [asyncio.create_task(caller()) for _ in range(args.callers)]
    if deadline is None:
        await asyncio.gather(*tasks)
    else:
        await asyncio.sleep(args.seconds)
        for task in tasks:  # cancelled wherever they are: waiting, in an attempt, backing off
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    elapsed = time.monotonic() - started
    sampler.cancel()
    leaked = None if limit is None else {"active": limit.active, "queue_depth": limit.queue_depth}
    final_limit = None if limit is None else limit.limit
    counted = _retry_counts(limit.reader) if hasattr(limit, "reader") else None
    latencies.sort()
    result = {
        "config": args.child,
        "completed": len(latencies),
        "failed": failures,
        "failure_kinds": kinds,
        "elapsed": elapsed,
        "cpu_seconds": time.process_time() - cpu,
        "p50": _quantile(latencies, 0.5),
        "p99": _quantile(latencies, 0.99),
        "leaked": leaked,
        "final_limit": final_limit,
        "retry_counts": counted,
        "limit_mean": statistics.fmean(sizes) if sizes else None,
        "limit_above_capacity": (sum(1 for n in sizes if n > CAPACITY) / len(sizes))
        if sizes
        else None,
    }
    # Said before closing: the driver gives a close that hangs 20 s, then ends the process.
    print(json.dumps(result), file=sys.__stdout__, flush=True)
    await close()
    return result


def _retry_counts(reader: Any) -> dict[str, int]:
    """gym.concurrency.client.retries / retries_denied by reason, as the client recorded them."""
    from gym_concurrency import names

    counts: dict[str, int] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    attributes = dict(point.attributes)
                    if metric.name == names.CLIENT_RETRIES_INSTRUMENT:
                        key = "retried_" + attributes[names.RETRY_REASON_ATTRIBUTE]
                    elif metric.name == names.CLIENT_RETRIES_DENIED_INSTRUMENT:
                        key = "denied_" + attributes[names.RETRY_DENIED_REASON_ATTRIBUTE]
                    else:
                        continue
                    counts[key] = counts.get(key, 0) + int(point.value)
    return counts


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return values[min(len(values) - 1, int(q * len(values)))]


# --- the driver -------------------------------------------------------------------------------


def _pinned(cpu: str, command: list[str]) -> list[str]:
    if shutil.which("taskset") and (os.cpu_count() or 1) >= 2:
        return ["taskset", "-c", cpu, *command]
    return command


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _http(url: str, method: str = "GET") -> Any:
    request = urllib.request.Request(url, data=b"" if method == "POST" else None, method=method)
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


@contextlib.contextmanager
def _upstream() -> Any:
    port = _free_port()
    command = [sys.executable, "-m", "uvicorn", "benchmarks.outbound_upstream:app", "--host", HOST]
    command += ["--port", str(port), "--no-access-log", "--log-level", "warning"]
    with contextlib.suppress(ImportError):
        import httptools  # noqa: F401
        import uvloop  # noqa: F401

        command += ["--loop", "uvloop", "--http", "httptools"]
    process = subprocess.Popen(_pinned("0", command), cwd=ROOT)
    url = f"http://{HOST}:{port}"
    try:
        for _ in range(200):
            with contextlib.suppress(OSError):
                _http(url + "/stats")
                break
            time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        process.wait(10)


def _children(config: str, url: str, mode: str, args: argparse.Namespace, redis_url: str | None):
    processes = 2 if config == "ours_global" else 1
    command = [sys.executable, "-m", "benchmarks.outbound", "--child", config, "--url", url]
    command += ["--mode", mode, "--callers", str(args.callers // processes)]
    command += ["--calls", str(args.calls // processes), "--seconds", str(HEALTHY + DOWN + BACK)]
    if redis_url:
        command += ["--redis-url", redis_url]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return [
        subprocess.Popen(
            _pinned("1", command), cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
        )
        for _ in range(processes)
    ]


def _collect(children: list[subprocess.Popen[str]]) -> list[dict[str, Any]]:
    results = []
    for child in children:
        assert child.stdout is not None
        line = child.stdout.readline()
        while line and not line.startswith("{"):
            line = child.stdout.readline()
        result = json.loads(line)
        try:
            child.wait(20)
        except subprocess.TimeoutExpired:  # its client or limit did not close: noted, ended
            result["close_hung"] = True
            child.kill()
            child.wait()
        results.append(result)
    return results


def _merge(results: list[dict[str, Any]]) -> dict[str, Any]:
    merged = dict(results[0])
    if len(results) > 1:
        for key in ("completed", "failed", "cpu_seconds"):
            merged[key] = sum(r[key] for r in results)
        merged["elapsed"] = max(r["elapsed"] for r in results)
        merged["p50"] = statistics.median(r["p50"] for r in results if r["p50"] is not None)
        merged["p99"] = max(r["p99"] for r in results if r["p99"] is not None)
        merged["leaked"] = [r["leaked"] for r in results]
    return merged


def steady(config: str, url: str, args: argparse.Namespace, redis_url: str | None) -> dict:
    _http(url + "/reset", "POST")
    children = _children(config, url, "steady", args, redis_url)
    result = _merge(_collect(children))
    stats = _http(url + "/stats")
    requests = stats["requests"]
    ok_times = [t for t, status, _ in requests if status == 200]
    capacity = CAPACITY / stats["mean_service_seconds"]  # calls/s the upstream can serve
    span = max(ok_times) - min(t for t, _, _ in requests)
    ok_times.sort()
    low, high = ok_times[len(ok_times) // 20], ok_times[len(ok_times) * 19 // 20]
    result.update(
        attempts=len(requests),
        attempts_per_call=len(requests) / args.calls,
        goodput_ratio=len(ok_times) / span / capacity,
        # the middle 90% of the completions: the start and the last stragglers left out
        goodput_ratio_middle=0.9 * len(ok_times) / (high - low) / capacity,
        capacity_per_second=capacity,
        # how full the upstream's 32 places were, with the time each request really took
        occupancy=len(ok_times) * stats["mean_held_seconds"] / span / CAPACITY,
        early_attempts=stats["early"],
        early_max_seconds=stats["early_max_seconds"],
        upstream_max_inside=stats["max_inside"],
    )
    return result


def outage(config: str, url: str, args: argparse.Namespace, redis_url: str | None) -> dict:
    _http(url + "/reset", "POST")
    children = _children(config, url, "outage", args, redis_url)
    for child in children:
        assert child.stdout is not None
        child.stdout.readline()  # "started"
    time.sleep(HEALTHY)
    _http(url + f"/down?seconds={DOWN}", "POST")
    result = _merge(_collect(children))
    stats = _http(url + "/stats")
    requests = stats["requests"]
    down_start = min((t for t, status, _ in requests if status == 503), default=HEALTHY)
    window = [r for r in requests if down_start + 10 <= r[0] < down_start + DOWN]
    firsts = sum(1 for r in window if r[2])
    capacity = CAPACITY / stats["mean_service_seconds"]
    recovered_at = down_start + DOWN
    ok = sorted(t for t, status, _ in requests if status == 200)
    before = _rate(ok, 1.0, down_start)  # goodput before the outage (after a 1 s warm-up)
    back = None
    for step in range(int((BACK - 1.0) / STEP) + 1):  # 1 s windows, every 0.25 s
        start = recovered_at + step * STEP
        if _rate(ok, start, start + 1.0) >= 0.95 * before:
            back = step * STEP + 1.0  # the end of the first window back at 0.95x
            break
    result.update(
        outage_attempts_per_second=len(window) / (DOWN - 10),
        outage_first_attempts_per_second=firsts / (DOWN - 10),
        outage_retries_per_second=(len(window) - firsts) / (DOWN - 10),
        seconds_to_goodput=back,
        goodput_before_ratio=before / capacity,
        early_attempts=stats["early"],
    )
    return result


def _rate(times: list[float], start: float, end: float) -> float:
    """Events per second in [start, end) of the sorted `times`."""
    return (bisect.bisect_left(times, end) - bisect.bisect_left(times, start)) / (end - start)


def _median_of(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Each numeric figure's median over the rounds (the rest from the first round)."""
    merged = dict(results[0])
    for key, value in results[0].items():
        values = [r[key] for r in results if isinstance(r.get(key), int | float)]
        if isinstance(value, int | float) and not isinstance(value, bool) and values:
            merged[key] = statistics.median(values)
    merged["rounds"] = len(results)
    return merged


def _redis() -> Any:
    sys.path.insert(0, str(ROOT))
    from tests.shared.redis_server import RedisServer

    return RedisServer(Path(tempfile.mkdtemp(prefix="outbound-redis-")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--callers", type=int, default=512)
    parser.add_argument("--only", default=",".join(CONFIGS))
    parser.add_argument("--rounds", type=int, default=2, help="steady rounds (openai_default: 1)")
    parser.add_argument("--no-outage", action="store_true")
    parser.add_argument("--raw", type=Path, default=ROOT / "benchmarks/results/outbound.json")
    parser.add_argument(
        "--summary", type=Path, default=ROOT / "benchmarks/results/outbound.summary.json"
    )
    # the child
    parser.add_argument("--child")
    parser.add_argument("--url")
    parser.add_argument("--mode", default="steady")
    parser.add_argument("--seconds", type=float, default=HEALTHY + DOWN + BACK)
    parser.add_argument("--redis-url")
    args = parser.parse_args()
    if args.child:
        if args.child in ("nemo_gym", "semaphore64"):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - it prints a line per retry
        asyncio.run(_child(args))  # prints its result
        return
    configs = [c for c in args.only.split(",") if c]
    redis = _redis() if "ours_global" in configs else None
    redis_url = redis.url if redis else None
    rows: dict[str, Any] = {}
    try:
        with _upstream() as url:
            rounds: dict[str, list[dict[str, Any]]] = {config: [] for config in configs}
            for round_number in range(args.rounds):  # interleaved: drift hits every config
                for config in configs:
                    if config == "openai_default" and round_number:
                        continue  # ~90 s a round: CPU-bound in httpx's pool, once is enough
                    result = steady(config, url, args, redis_url)
                    rounds[config].append(result)
                    print(json.dumps({config: result}), flush=True)
            for config in configs:
                rows[config] = {"steady": _median_of(rounds[config]), "rounds": rounds[config]}
            if not args.no_outage:
                for config in configs:
                    rows[config]["outage"] = outage(config, url, args, redis_url)
                    print(json.dumps({config: rows[config]["outage"]}), flush=True)
    finally:
        if redis is not None:
            redis.stop()
    if args.raw:
        args.raw.write_text(json.dumps(rows, indent=1))
    if args.summary:
        args.summary.write_text(json.dumps(_summary(rows, args), indent=1) + "\n")
    print(_table(rows))


def _summary(rows: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    keep = (
        "attempts_per_call",
        "goodput_ratio",
        "goodput_ratio_middle",
        "occupancy",
        "failed",
        "p50",
        "p99",
        "early_attempts",
        "leaked",
        "final_limit",
        "outage_attempts_per_second",
        "outage_first_attempts_per_second",
        "outage_retries_per_second",
        "seconds_to_goodput",
        "goodput_before_ratio",
        "failure_kinds",
        "retry_counts",
        "close_hung",
        "limit_mean",
        "limit_above_capacity",
    )
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    summary: dict[str, Any] = {
        "commit": commit,
        "python": sys.version.split()[0],
        "calls": args.calls,
        "callers": args.callers,
        "capacity": CAPACITY,
        "machine": f"{os.cpu_count()} CPUs, shared with other jobs; upstream on CPU 0, callers "
        "on CPU 1",
    }
    for config, phases in rows.items():
        summary[config] = {
            phase: {k: _round(v) for k, v in values.items() if k in keep or k == "rounds"}
            for phase, values in phases.items()
            if phase != "rounds"
        }
        for key in ("goodput_ratio", "attempts_per_call"):  # the spread behind each median
            rounds = [_round(r[key]) for r in phases.get("rounds", [])]
            summary[config]["steady"][f"{key}_rounds"] = rounds
    return summary


def _round(value: Any) -> Any:
    return round(value, 3) if isinstance(value, float) else value


def _table(rows: dict[str, Any]) -> str:
    lines = [
        "| client | attempts / call | goodput / capacity | failed | p50 s | p99 s | "
        "before Retry-After | outage attempts/s (first + retries) | s to 0.95x goodput |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for config, phases in rows.items():
        s = phases["steady"]
        if not isinstance(s, dict):
            continue
        o = phases.get("outage", {})
        outage_text = (
            f"{o['outage_attempts_per_second']:.0f} ({o['outage_first_attempts_per_second']:.0f}"
            f" + {o['outage_retries_per_second']:.0f})"
            if o
            else "-"
        )
        back = o.get("seconds_to_goodput")
        lines.append(
            f"| {config} | {s['attempts_per_call']:.2f} | {s['goodput_ratio']:.2f} | "
            f"{s['failed']} | {_fmt(s['p50'])} | {_fmt(s['p99'])} | {s['early_attempts']} | "
            f"{outage_text} | {'-' if not o else ('> 10' if back is None else back)} |"
        )
    return "\n".join(lines)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


if __name__ == "__main__":
    main()
