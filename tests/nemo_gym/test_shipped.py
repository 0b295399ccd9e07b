"""NeMo Gym as shipped, instrumented by the one opt-in (issue 27), judged by NeMo Gym's own CLI
over the wheel's own servers: `gym-concurrency-nemo-gym gym env start` over
examples/nemo_gym/shipped (openai_model and math_with_judge from the wheel, an environment
server written with NeMo Gym alone), then `gym-concurrency-nemo-gym gym eval run`.

- The seed's four limits (`rollouts`, `upstream_requests`, `episodes`, `library_verifier`) are
  reported with the seed's names and attributes, move during the run and are back to 0 after.
- A model server whose `upstream_requests` times out answers a refusal that the environment
  server's `run()`, through NeMo Gym's own ServerClient, ends as a non-terminal failure at the
  `agent` stage: 0 terminal rows, and `--resume` completes them.
- The same runs with and without the opt-in, alternating: the instrumentation's cost (held to
  a generous bound here; docs/nemo-gym.md has the figures).
"""

from __future__ import annotations

import os
import re
import statistics
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.nemo_gym.requires import skip_module_without_nemo_gym

skip_module_without_nemo_gym()

from tests.nemo_gym.gym_stack import DOC, EvalRun, fake_upstream  # noqa: E402
from tests.nemo_gym.shipped_stack import (  # noqa: E402
    LimitLine,
    ShippedStack,
    limit_lines,
    write_tasks,
)

TASKS = int(os.environ.get("NEMO_GYM_SHIPPED_TASKS", "64"))
CONCURRENCY = int(os.environ.get("NEMO_GYM_SHIPPED_CONCURRENCY", "32"))
LATENCY = 0.1  # s per upstream call
SEED_LIMITS = {  # limit_name -> the attributes the seed gives it (component, limit_name, server)
    "rollouts": ("rollout_driver", "rollouts"),
    "upstream_requests": ("model_server", "upstream_requests", "policy_model"),
    "episodes": ("environment_server", "episodes", "plain_math_env"),
    "library_verifier": ("resources_server", "library_verifier", "math_with_judge"),
}

# The ServerClient case (refusals met in run()): NEMO_GYM_SHIPPED_REFUSAL_TASKS=400
# NEMO_GYM_SHIPPED_REFUSAL_CONCURRENCY=128 is the table in docs/nemo-gym.md; CI runs 32 at 16.
REFUSAL_TASKS = int(os.environ.get("NEMO_GYM_SHIPPED_REFUSAL_TASKS", "32"))
REFUSAL_CONCURRENCY = int(os.environ.get("NEMO_GYM_SHIPPED_REFUSAL_CONCURRENCY", "16"))

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    with fake_upstream(LATENCY, capacity=1000) as (url, _door):
        yield url


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, upstream: str) -> Iterator[ShippedStack]:
    with ShippedStack(tmp_path_factory.mktemp("shipped"), upstream) as started:
        yield started


def by_limit(lines: list[LimitLine]) -> dict[str, list[LimitLine]]:
    found: dict[str, list[LimitLine]] = {}
    for line in lines:
        found.setdefault(line.limit_name, []).append(line)
    return found


def terminal(run: EvalRun) -> list[dict[str, object]]:
    return [row for row in run.failures if row.get("_ng_failure_terminal")]


def test_the_seeds_four_limits_move_and_end_at_zero(stack: ShippedStack, tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    write_tasks(tasks, TASKS)
    server_lines_before = len(limit_lines(stack.log))
    run = stack.eval_run(tasks, "results/seed.jsonl", "--concurrency", str(CONCURRENCY))
    assert run.returncode == 0, run.log[-4000:]
    assert len(run.rollouts) == TASKS, run.log[-4000:]
    assert all(row["reward"] == 1.0 for row in run.rollouts)
    # Every answer read by the verifier: math_with_judge's key metrics count none as missing.
    assert all(row["extracted_answer"] is not None for row in run.rollouts)
    assert '"pass@1[avg-of-1]/no_answer": 0.0' in run.log, run.log[-3000:]

    seen = by_limit(limit_lines(run.log) + limit_lines(stack.log)[server_lines_before:])
    for name, lines in sorted(seen.items()):  # the figures (pytest -s)
        peak = {k: max(line.values[k] for line in lines) for k in ("active", "queue_depth")}
        print(f"{name}: limit {lines[-1].values['limit']}, peak {peak}, {len(lines)} lines")
    for name, label in SEED_LIMITS.items():
        lines = seen.get(name)
        assert lines, f"{name} never reported: {sorted(seen)}"
        assert {line.label for line in lines} == {label}
        assert max(line.values["active"] for line in lines) > 0, (name, lines)
    # The driver's: full while the run lasts, with the rest of the tasks queued behind it.
    rollouts = seen["rollouts"]
    assert {line.values["limit"] for line in rollouts} == {CONCURRENCY}
    assert max(line.values["queue_depth"] for line in rollouts) > 0
    assert rollouts[-1].values["active"] == rollouts[-1].values["queue_depth"] == 0
    # The servers': back to 0 once the run is over (their next line, within a few exports).
    stack_lines = by_limit(_settled(stack))
    for name in ("upstream_requests", "episodes", "library_verifier"):
        last = stack_lines[name][-1].values
        assert last["active"] == last["queue_depth"] == 0, (name, last)
        assert last["available"] == last["limit"]
    assert stack_lines["episodes"][-1].values["limit"] == 8
    assert stack_lines["library_verifier"][-1].values["limit"] == 4


def test_the_lines_shown_in_the_doc_are_the_exporters_lines() -> None:
    [block] = [b for b in DOC.read_text().split("```text\n")[1:] if b.startswith("driver [")]
    shown = block.split("```", 1)[0].splitlines()
    lines = limit_lines("\n".join(shown))
    assert len(lines) == len(shown)
    assert {line.label for line in lines} == set(SEED_LIMITS.values())


# 4 episodes at once, each waiting at most 50 ms to start; one upstream slot, a 50 ms wait for
# it: of 16 rollouts at once most are refused, at admission or by the model server.
SERVER = "plain_math_env.environment_servers.plain_math_env"
MODEL = "policy_model.responses_api_models.openai_model"
TIGHT = [
    f"++{SERVER}.max_concurrent_episodes=4",
    f"++{SERVER}.queue_timeout_seconds=0.05",
    f"++{MODEL}.max_concurrent_requests=1",
    f"++{MODEL}.upstream_pool_timeout_seconds=0.05",
]
NO_DRIVER_WAIT = {"GYM_CONCURRENCY_NEMO_GYM_REFUSED_WAIT_SECONDS": "0"}


def test_refusals_met_through_server_client_are_not_terminal(
    tmp_path_factory: pytest.TempPathFactory, upstream: str, tmp_path: Path
) -> None:
    # The driver's wait off: every refusal reaches NeMo Gym's collector as a failure row.
    tasks = tmp_path / "tasks.jsonl"
    write_tasks(tasks, REFUSAL_TASKS)
    with ShippedStack(tmp_path_factory.mktemp("tight"), upstream, config=TIGHT) as stack:
        first = stack.eval_run(
            tasks,
            "results/tight.jsonl",
            "--concurrency",
            str(REFUSAL_CONCURRENCY),
            env=NO_DRIVER_WAIT,
        )
        assert first.returncode == 0, first.log[-4000:]
        assert terminal(first) == []
        stages = {}
        for row in first.failures:
            stages.setdefault(row["_ng_failure_stage"], []).append(row["_ng_failure_message"])
        assert set(stages) == {"admission", "agent"}, stages  # both limits refused
        assert set(stages["admission"]) == {"Episode admission timed out"}
        assert all("upstream_requests: no slot within 0.05 s" in m for m in stages["agent"])
        # One --resume, one rollout at a time: every refused rollout runs again and completes.
        resumed = stack.eval_run(
            tasks, "results/tight.jsonl", "--concurrency", "1", "--resume", env=NO_DRIVER_WAIT
        )
        assert resumed.returncode == 0, resumed.log[-4000:]
        by_stage = {stage: len(messages) for stage, messages in stages.items()}
        print(  # the figures (pytest -s): docs/nemo-gym.md, "NeMo Gym as shipped", Measured
            f"\n{REFUSAL_TASKS} tasks at --concurrency {REFUSAL_CONCURRENCY}: first pass "
            f"{len(first.rollouts)} completed, {len(first.failures) - len(terminal(first))} "
            f"non-terminal {by_stage}, {len(terminal(first))} terminal; after one --resume "
            f"{len(resumed.rollouts)} completed, {len(terminal(resumed))} terminal"
        )
        assert terminal(resumed) == []
        assert len(resumed.rollouts) == REFUSAL_TASKS
        last = {line.limit_name: line.values for line in _settled(stack)}
    # Each refusal counted once, as an admission timeout of the limit that refused it.
    assert last["episodes"]["admission_timeouts_total"] == len(stages["admission"])
    assert last["upstream_requests"]["admission_timeouts_total"] == len(stages["agent"])
    assert last["episodes"]["active"] == last["upstream_requests"]["active"] == 0


def test_the_driver_waits_out_refusals_and_the_tight_run_completes(
    tmp_path_factory: pytest.TempPathFactory, upstream: str, tmp_path: Path
) -> None:
    # The same tight stack and command, the driver's wait as shipped: no refusal spends an attempt.
    tasks = tmp_path / "tasks.jsonl"
    write_tasks(tasks, REFUSAL_TASKS)
    with ShippedStack(tmp_path_factory.mktemp("waits"), upstream, config=TIGHT) as stack:
        run = stack.eval_run(
            tasks, "results/tight.jsonl", "--concurrency", str(REFUSAL_CONCURRENCY)
        )
        assert run.returncode == 0, run.log[-4000:]
        last = {line.limit_name: line.values for line in _settled(stack)}
    refused = {n: last[n]["admission_timeouts_total"] for n in ("episodes", "upstream_requests")}
    [again] = re.findall(r"the rollout driver posted (\d+) refused rollouts again", run.log)
    print(  # the figures (pytest -s): docs/nemo-gym.md, "Resume that finishes"
        f"\n{REFUSAL_TASKS} tasks at --concurrency {REFUSAL_CONCURRENCY}, the driver waiting: "
        f"{len(run.rollouts)} completed, {len(run.failures)} failure rows, refusals {refused}, "
        f"posted again {again}, collection {run.collection_seconds} s"
    )
    assert len(run.rollouts) == REFUSAL_TASKS, run.log[-4000:]
    assert run.failures == []
    assert all(row["reward"] == 1.0 for row in run.rollouts)
    assert refused["episodes"] > 0  # the servers did refuse, as in the test above ...
    assert int(again) == sum(refused.values())  # ... and the driver posted each one again


def _settled(stack: ShippedStack) -> list[LimitLine]:
    """The stack's lines once every server's last one shows nothing held (a few exports)."""
    import time

    deadline = time.monotonic() + 10
    while True:
        lines = limit_lines(stack.log)
        last = {line.limit_name: line.values for line in lines}
        idle = all(v["active"] == 0 and v["queue_depth"] == 0 for v in last.values())
        if idle or time.monotonic() > deadline:
            return lines
        time.sleep(0.2)


COST_TASKS = int(os.environ.get("NEMO_GYM_SHIPPED_COST_TASKS", "160"))
COST_ROUNDS = int(os.environ.get("NEMO_GYM_SHIPPED_COST_ROUNDS", "4"))
# The goal is 2 %; on a shared 2-core machine one run's noise is larger than that, so CI holds
# the median to a generous bound and prints the figure (docs/nemo-gym.md has the measurement).
COST_RATIO = float(os.environ.get("NEMO_GYM_SHIPPED_COST_RATIO", "1.5"))


def test_the_instrumentation_costs_little(
    tmp_path_factory: pytest.TempPathFactory, upstream: str, tmp_path: Path
) -> None:
    # The same stack twice, with and without the opt-in, up at once; the same runs alternate.
    tasks = tmp_path / "tasks.jsonl"
    write_tasks(tasks, COST_TASKS)
    seconds: dict[bool, list[float]] = {True: [], False: []}
    cpu: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    with (
        # Console lines as often as the doc's commands print them (every second).
        ShippedStack(tmp_path_factory.mktemp("with"), upstream, interval_ms=1000) as instrumented,
        ShippedStack(tmp_path_factory.mktemp("without"), upstream, opt_in=False) as plain,
    ):
        for number in range(COST_ROUNDS):
            for stack in (instrumented, plain) if number % 2 else (plain, instrumented):
                before, children = stack.cpu_seconds(), _children_cpu()
                run = stack.eval_run(
                    tasks, f"results/cost-{number}.jsonl", "--concurrency", str(CONCURRENCY)
                )
                used = {k: v - before.get(k, 0.0) for k, v in stack.cpu_seconds().items()}
                cpu[stack.opt_in].append(used | {"gym eval run": _children_cpu() - children})
                assert run.returncode == 0, run.log[-4000:]
                assert len(run.rollouts) == COST_TASKS
                assert run.collection_seconds is not None
                seconds[stack.opt_in].append(run.collection_seconds)
    ratio = statistics.median(seconds[True]) / statistics.median(seconds[False])
    print(f"\ncollection seconds with the opt-in {seconds[True]}, without {seconds[False]}")
    print(f"instrumentation cost: {100 * (ratio - 1):+.1f} % of the median wall time")
    for opt_in in (True, False):  # CPU seconds per run, medians
        names = sorted({name for used in cpu[opt_in] for name in used})
        medians = {
            n: round(statistics.median(u.get(n, 0.0) for u in cpu[opt_in]), 2) for n in names
        }
        print(f"CPU {'with' if opt_in else 'without'} the opt-in: {medians}")
    assert ratio <= COST_RATIO, seconds


def _children_cpu() -> float:
    """CPU time of this process's reaped children (each `gym eval run`)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime
