"""docs/flows.md as printed: every Python block runs, its YAML block is a valid settings file,
its environment block configures the route it describes."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from gym_concurrency.middleware import ConcurrencySettings, RouteLimit

DOC = Path(__file__).resolve().parent.parent / "docs" / "flows.md"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), re.DOTALL)


def test_the_doc_has_the_blocks_these_tests_run() -> None:
    assert (len(blocks("python")), len(blocks("yaml")), len(blocks("bash"))) == (5, 1, 1)


@pytest.mark.parametrize("index", range(5))
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
