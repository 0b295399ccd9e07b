"""NeMo Gym's own telemetry carries the shipped limits (issue 36), with the nemo-lens a user can
install (0.1.0, pinned in requirements.txt): the section's `gym env start` and `gym eval run`
with `telemetry.yaml`, under `gym-concurrency-nemo-gym`, NeMo Gym's OTLP exporter pointed at a
receiver in this test. Every server's limit and the driver's `rollouts` arrive through NeMo
Gym's exporter with NeMo Gym's resource, move during the run and read 0 active after it; no
process falls back to ours. Each process says so at INFO, and says why when NeMo Gym's
telemetry is off (the stack without `telemetry.yaml`)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.nemo_gym.requires import skip_module_without_nemo_gym

skip_module_without_nemo_gym()

from tests.nemo_gym.gym_stack import DOC, fake_upstream  # noqa: E402
from tests.nemo_gym.shipped_stack import ShippedStack, limit_lines, write_tasks  # noqa: E402
from tests.otlp_receiver import OtlpReceiver, Point  # noqa: E402

TASKS, CONCURRENCY = 24, 8  # small: the machine is shared (test_shipped.py measures)
RUN_ID = "shipped-stack"  # telemetry.yaml's
# limit_name -> the process that owns it: its NeMo Gym server name (the driver's, ours).
OWNERS = {
    "rollouts": "rollout_driver",
    "upstream_requests": "policy_model",
    "episodes": "plain_math_env",
    "library_verifier": "math_with_judge",
    "judge_calls": "math_with_judge",  # a limit NeMo Gym lacks; unused here (no judge call)
}
THROUGH_NEMO = "limits are exported through NeMo Gym's telemetry"
INSTEAD = "NeMo Gym's telemetry exports nothing in"

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    with fake_upstream(0.05, capacity=1000) as (url, _door):
        yield url


def test_the_limits_arrive_through_nemo_gyms_exporter(
    tmp_path_factory: pytest.TempPathFactory, upstream: str, tmp_path: Path
) -> None:
    tasks = tmp_path / "tasks.jsonl"
    write_tasks(tasks, TASKS)
    with OtlpReceiver() as receiver:
        config = [f"++telemetry.otlp_endpoint={receiver.url}"]  # telemetry.yaml's, replaced
        folder = tmp_path_factory.mktemp("telemetry")
        with ShippedStack(folder, upstream, telemetry=True, config=config) as stack:
            run = stack.eval_run(
                tasks, "results/telemetry.jsonl", "--concurrency", str(CONCURRENCY)
            )
            assert run.returncode == 0, run.log[-4000:]
            assert len(run.rollouts) == TASKS, run.log[-4000:]
            settled = _settled(receiver)
            server_log = stack.log

    active = {name: [p for p in settled if _limit(p) == name] for name in OWNERS}
    for name, owner in OWNERS.items():
        points = active[name]
        assert points, f"{name} never arrived: {sorted({_limit(p) for p in settled})}"
        for point in points:  # NeMo Gym's resource, as its init_telemetry builds it
            assert point.resource["service.name"] == f"nemo-gym/{owner}", point.resource
            assert point.resource["nemo.gym.server.name"] == owner
            assert point.resource["nemo.gym.version"] == "0.7.0"
            assert point.resource["nemo.gym.service_group"] == "nemo-gym"
            assert point.resource["nemo.run.id"] == RUN_ID
            assert point.resource["nv.dl.rank"] == 0
            assert point.resource["nv.dl.world_size"] == 1
        if name != "judge_calls":  # the library verifies every answer: no judge call is made
            assert max(p.value for p in points) > 0, (name, [p.value for p in points])
        assert points[-1].value == 0, (name, [p.value for p in points])
    assert {_limit(p): p.value for p in receiver.series("gym.concurrency.limit")} == {
        "rollouts": CONCURRENCY,
        "upstream_requests": 8,
        "episodes": 8,
        "library_verifier": 4,
        "judge_calls": 8,  # what its judge model server, policy_model, takes
    }
    # Every process exported through NeMo Gym's telemetry, none through ours.
    [shown] = [line for line in _doc_info_lines() if THROUGH_NEMO in line]
    assert shown in server_log.splitlines()  # the model server's line, as the doc shows
    log = server_log + run.log
    assert log.count(THROUGH_NEMO) == len(set(OWNERS.values())), log[-4000:]
    assert INSTEAD not in log
    assert limit_lines(log) == []  # no console line: ours never started
    assert "lacks NV_DL_RANK, NV_DL_WORLD_SIZE" in run.log  # the driver's own INFO line


def test_without_telemetry_each_process_says_why_at_info(
    tmp_path_factory: pytest.TempPathFactory, upstream: str, tmp_path: Path
) -> None:
    tasks = tmp_path / "tasks.jsonl"
    write_tasks(tasks, 4)
    # Console lines every second, as the section's exports say: the line the doc shows.
    with ShippedStack(tmp_path_factory.mktemp("plain"), upstream, interval_ms=1000) as stack:
        run = stack.eval_run(tasks, "results/plain.jsonl", "--concurrency", "4")
        assert run.returncode == 0, run.log[-4000:]
        server_log = stack.log
    [shown] = [line for line in _doc_info_lines() if INSTEAD in line]
    assert shown in server_log.splitlines()  # the model server's line, as the doc shows
    assert "exports nothing in rollout_driver's process (it is not enabled" in run.log
    assert (server_log + run.log).count(INSTEAD) == len(set(OWNERS.values()))
    assert THROUGH_NEMO not in server_log + run.log


def _doc_info_lines() -> list[str]:
    """The INFO lines the doc shows (its `text` block of them)."""
    [block] = [b for b in DOC.read_text().split("```text\n")[1:] if b.startswith("INFO:")]
    return block.split("```", 1)[0].splitlines()


def _limit(point: Point) -> str:
    return str(point.attributes["nemo.gym.concurrency.limit_name"])


def _settled(receiver: OtlpReceiver, seconds: float = 30) -> list[Point]:
    """`gym.concurrency.active` as received, once every owner's last point reads 0 (the
    driver's last export is at its exit; a server's within an export interval)."""
    deadline = time.monotonic() + seconds
    while True:
        points = receiver.series("gym.concurrency.active")
        last = {_limit(p): p.value for p in points}
        if (set(OWNERS) <= set(last) and not any(last.values())) or time.monotonic() > deadline:
            return points
        time.sleep(0.2)
