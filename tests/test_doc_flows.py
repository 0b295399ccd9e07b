"""docs/flows.md as printed: every Python block runs, its YAML block is a valid settings file,
its environment block configures the route it describes, its command prints a credential's id."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from gym_concurrency.middleware import ConcurrencySettings, RouteLimit

from gym_concurrency.hashed_flows import hashed_flow

DOC = Path(__file__).resolve().parent.parent / "docs" / "flows.md"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), re.DOTALL)


def test_the_doc_has_the_blocks_these_tests_run() -> None:
    assert (len(blocks("python")), len(blocks("yaml")), len(blocks("bash"))) == (7, 1, 2)


@pytest.mark.parametrize("index", range(7))
def test_every_python_block_runs(index: int) -> None:
    block = blocks("python")[index]
    run = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr


def test_the_yaml_block_is_a_settings_file(tmp_path: Path) -> None:
    path = tmp_path / "limits.yaml"
    path.write_text(blocks("yaml")[0])
    settings = ConcurrencySettings.from_file(path)
    judge, run = settings.routes
    assert (judge.weight, judge.flow, judge.default_output_tokens) == (
        "openai_tokens",
        "header:x-gym-environment",
        1024,
    )
    assert run.flow == "json:responses_create_params.metadata.taskset"


def test_the_environment_block_configures_the_same_route(monkeypatch: pytest.MonkeyPatch) -> None:
    for line in blocks("bash")[0].splitlines():
        name, _, value = line.partition("=")
        monkeypatch.setenv(name, value)
    route = ConcurrencySettings().routes[0]
    assert route == RouteLimit(
        path="/judge",
        limit_name="judge_tokens",
        max_concurrent=64000,
        weight="openai_tokens",
        flow="header:x-gym-environment",
    )


def test_the_command_block_prints_the_id_of_a_credential() -> None:
    key, token = "0f1e2d3c4b5a69788796a5b4c3d2e1f0", "sk-team-a-token"
    python_dir = str(Path(sys.executable).parent)  # `python` as the block calls it
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("GYM_CONCURRENCY_")},
        "PATH": python_dir + os.pathsep + os.environ.get("PATH", ""),
        "FLOW_KEY": key,
        "TEAM_A_TOKEN": token,
    }
    run = subprocess.run(
        ["bash", "-c", blocks("bash")[1]], capture_output=True, text=True, timeout=60, env=env
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout == hashed_flow(f"Bearer {token}", key.encode()) + "\n"
