"""The opt-in itself (`gym-concurrency-nemo-gym`), in real subprocesses of this venv: it
reaches a child's child through the environment, patches NeMo Gym 0.7.0 only, refuses any other
version with one log line, chains to a `sitecustomize` it shadows, and does nothing without its
variable; the seed's console line, as the exporter writes it."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from gym_concurrency.middleware.nemo_gym_shipped.console_lines import console_line
from gym_concurrency.middleware.nemo_gym_shipped.launch import BOOTSTRAP, environment

from tests.nemo_gym.requires import needs_nemo_gym

WRAPPER = str(Path(sys.prefix) / "bin" / "gym-concurrency-nemo-gym")
# What a NeMo Gym process sees once it imported the modules the opt-in patches.
PROBE = textwrap.dedent(
    """
    import nemo_gym.rollout_collection as rc, nemo_gym.server_utils as su
    from nemo_gym.base_environment_server import BaseEnvironmentServer as B
    print("rollouts:", rc.Semaphore.__name__)
    def state(f): return "patched" if hasattr(f, "__wrapped__") else "shipped"
    print("setup_telemetry:", state(su.SimpleServer.setup_telemetry))
    print("run_request:", state(B.run_request))
    """
)


def run(args: list[str], env: dict[str, str], cwd: Path | None = None) -> str:
    done = subprocess.run(
        args, env=env, cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GYM_CONCURRENCY_")}
    env.pop("PYTHONPATH", None)
    return env


@needs_nemo_gym
def test_the_console_script_reaches_a_grandchild_and_patches_nemo_gym() -> None:
    # The wrapper execs bash, whose python (as `gym env start` launches a server) is patched.
    command = f"{sys.executable} -c {shlex.quote(PROBE)}"
    out = run([WRAPPER, "bash", "-c", command], clean_env())
    assert "rollouts: RolloutsSemaphore" in out
    assert "setup_telemetry: patched" in out
    assert "run_request: patched" in out


@needs_nemo_gym
def test_without_the_opt_in_nothing_is_patched() -> None:
    # The bootstrap folder on PYTHONPATH alone (a stale one) does nothing.
    env = clean_env() | {"PYTHONPATH": str(BOOTSTRAP)}
    out = run([sys.executable, "-c", PROBE], env)
    assert "rollouts: Semaphore" in out
    assert "setup_telemetry: shipped" in out
    assert "run_request: shipped" in out
    assert "gym_concurrency" not in out


def test_a_process_that_never_imports_nemo_gym_imports_nothing_of_ours() -> None:
    probe = "import sys; print(sorted(m for m in sys.modules if m.startswith('gym_conc')))"
    out = run([sys.executable, "-c", probe], environment(clean_env()))
    assert out.strip() == "[]"


@needs_nemo_gym
def test_another_nemo_gym_version_is_refused_with_one_line(tmp_path: Path) -> None:
    # A NeMo Gym 0.8.0 distribution first on the path: never patched, one line says why.
    info = tmp_path / "nemo_gym-0.8.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: nemo-gym\nVersion: 0.8.0\n")
    env = environment(clean_env())
    env["PYTHONPATH"] += os.pathsep + str(tmp_path)
    out = run([sys.executable, "-c", PROBE], env)
    assert "rollouts: Semaphore" in out
    refused = [line for line in out.splitlines() if line.startswith("gym_concurrency:")]
    assert len(refused) == 1, out
    assert "NeMo Gym version 0.8.0" in refused[0]
    assert "only for 0.7.0" in refused[0]
    assert "not patched" in refused[0]


def test_a_shadowed_sitecustomize_still_runs(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text("print('the other sitecustomize ran')\n")
    env = environment(clean_env() | {"PYTHONPATH": str(tmp_path)})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(BOOTSTRAP), str(tmp_path)]
    out = run([sys.executable, "-c", "import sitecustomize; print(sitecustomize.__file__)"], env)
    assert "the other sitecustomize ran" in out
    assert str(tmp_path / "sitecustomize.py") in out


def test_env_prints_the_two_exports() -> None:
    out = run([WRAPPER, "--env"], clean_env())
    assert out.splitlines() == [
        f"export PYTHONPATH={BOOTSTRAP}",
        "export GYM_CONCURRENCY_NEMO_GYM=1",
    ]


@pytest.mark.parametrize(
    ("label", "values", "line"),
    [
        (  # the seed's driver line
            ("rollout_driver", "rollouts", None),
            {"limit": 1, "active": 1, "available": 0, "queue_depth": 2},
            "driver [rollout_driver, rollouts] limit=1 active=1 available=0 queue_depth=2",
        ),
        (  # the seed's model-server line, with its timeout counter
            ("model_server", "upstream_requests", "policy_model"),
            {
                "limit": 1,
                "active": 0,
                "available": 1,
                "queue_depth": 0,
                "admission_timeouts_total": 2,
                "admission_cancelled_total": 0,
            },
            "policy_model [model_server, upstream_requests, policy_model] limit=1 active=0 "
            "available=1 queue_depth=0 admission_timeouts_total=2",
        ),
    ],
)
def test_the_seeds_console_line(
    label: tuple[str, str, str | None], values: dict[str, int], line: str
) -> None:
    assert console_line(label, values) == line


# NeMo Gym's own telemetry in one process, and what the opt-in says of it (its INFO line).
TELEMETRY_PROBE = textwrap.dedent(
    """
    import logging, sys
    {before}
    from nemo_gym.telemetry.setup import init_telemetry, is_metrics_exporter_active
    init_telemetry(server_name="probe", server_type="probe")
    print("exporting:", is_metrics_exporter_active())
    from gym_concurrency.middleware.nemo_gym_shipped.export import ensure_export
    from gym_concurrency import MeteredSemaphore
    limit = MeteredSemaphore(2, component="probe", limit_name="probe")
    ensure_export("probe")
    """
)
ENABLED = {
    "NEMO_GYM_OTEL_ENABLED": "1",
    "NEMO_GYM_OTEL_EXPORTER": "console",
    "NEMO_GYM_OTEL_TRACES_ENABLED": "0",
    "OTEL_METRIC_EXPORT_INTERVAL": "600000",
}


@needs_nemo_gym
@pytest.mark.parametrize(
    ("variables", "before", "said"),
    [
        ({}, "", "exports nothing in probe's process (it is not enabled: no `telemetry:"),
        (
            ENABLED | {"NEMO_GYM_OTEL_METRICS_ENABLED": "0"},
            "",
            "exports nothing in probe's process (its metrics are off",
        ),
        (  # nemo-lens unimportable, as where it is not installed
            ENABLED,
            "sys.modules['nemo.lens'] = None",
            "exports nothing in probe's process (it is enabled, but nemo-lens is not installed",
        ),
        (ENABLED, "", "probe's limits are exported through NeMo Gym's telemetry"),
    ],
)
def test_where_the_limits_go_is_said_at_info(
    variables: dict[str, str], before: str, said: str
) -> None:
    probe = TELEMETRY_PROBE.format(before=before)
    out = run([WRAPPER, sys.executable, "-c", probe], clean_env() | variables)
    [line] = [
        line for line in out.splitlines() if "gym_concurrency.nemo_gym" in line and said in line
    ]
    assert line.startswith("INFO:gym_concurrency.nemo_gym:gym_concurrency: ")
    assert ("exporting: True" in out) == ("exported through NeMo Gym's" in said)
    if "exports nothing" in said:  # and what instead: ours, the default console lines
        assert "; its limits are exported by gym-concurrency instead: console_line every" in line


@needs_nemo_gym
def test_nemo_gym_needs_the_two_names_nemo_lens_lacks() -> None:
    # As shipped: NeMo Gym 0.7.0's telemetry does not start with nemo-lens 0.1.0, and says so
    # only at DEBUG, as "not installed".
    probe = "import logging; logging.basicConfig(level=logging.DEBUG)\n" + TELEMETRY_PROBE.format(
        before=""
    ).replace("from gym_concurrency", "sys.exit()  # ours not imported\nfrom gym_concurrency")
    out = run([sys.executable, "-c", probe], clean_env() | ENABLED)
    assert "exporting: False" in out
    assert "DEBUG:nemo_gym.telemetry.setup:nemo-lens is not installed" in out
    semconv = "import nemo.lens.semconv as s; print(hasattr(s, 'NV_DL_RANK'), s.DL_RANK)"
    assert run([sys.executable, "-c", semconv], clean_env()).split() == ["False", "dl.rank"]
    # Under the opt-in: the names, with nemo-lens's values, said at INFO; and it exports.
    out = run(
        [WRAPPER, sys.executable, "-c", TELEMETRY_PROBE.format(before="")], clean_env() | ENABLED
    )
    assert "exporting: True" in out
    assert (
        "INFO:gym_concurrency.nemo_gym:gym_concurrency: nemo-lens 0.1.0 lacks NV_DL_RANK, "
        "NV_DL_WORLD_SIZE, which NeMo Gym 0.7.0's telemetry imports; supplied with nemo-lens's "
        "own values (NV_DL_RANK='nv.dl.rank', NV_DL_WORLD_SIZE='nv.dl.world_size')"
    ) in out
    # NeMo Gym's console exporter's last export (at exit): the limit, with NeMo Gym's resource.
    assert '"name": "gym.concurrency.limit"' in out
    assert '"nv.dl.rank": 0' in out


@needs_nemo_gym
def test_a_semconv_name_nemo_lens_has_is_never_replaced() -> None:
    # A nemo-lens that has NV_DL_RANK keeps its value; only the missing name is added.
    probe = textwrap.dedent(
        """
        import nemo.lens.semconv as semconv
        semconv.NV_DL_RANK = "its.own.rank"
        import nemo_gym.telemetry.setup  # the opt-in's hook: patches what is imported already
        print(semconv.NV_DL_RANK, semconv.NV_DL_WORLD_SIZE)
        """
    )
    out = run([WRAPPER, sys.executable, "-c", probe], clean_env())
    assert "its.own.rank nv.dl.world_size" in out.splitlines()


@pytest.mark.parametrize(
    ("variables", "seconds"),
    [
        ({}, 5.0),
        ({"OTEL_METRIC_EXPORT_INTERVAL": "2000"}, 2.0),
        # Ours first: OTEL_METRIC_EXPORT_INTERVAL is left to NeMo Gym's exporter (nemo-lens).
        (
            {
                "GYM_CONCURRENCY_NEMO_GYM_EXPORT_INTERVAL": "1000",
                "OTEL_METRIC_EXPORT_INTERVAL": "9",
            },
            1,
        ),
    ],
)
def test_our_export_interval_has_its_own_variable(
    variables: dict[str, str], seconds: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gym_concurrency.middleware.nemo_gym_shipped.export import export_interval

    for name in ("GYM_CONCURRENCY_NEMO_GYM_EXPORT_INTERVAL", "OTEL_METRIC_EXPORT_INTERVAL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert export_interval() == seconds


def test_an_export_interval_that_is_not_milliseconds_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gym_concurrency.middleware.nemo_gym_shipped.export import export_interval

    monkeypatch.setenv("GYM_CONCURRENCY_NEMO_GYM_EXPORT_INTERVAL", "-1")
    with pytest.raises(ValueError, match="GYM_CONCURRENCY_NEMO_GYM_EXPORT_INTERVAL must be"):
        export_interval()
