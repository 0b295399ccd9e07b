"""docs/deadlines.md as printed: its Python blocks run, its YAML block is a settings file."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from gym_concurrency.middleware import ConcurrencySettings

DOC = Path(__file__).resolve().parent.parent / "docs" / "deadlines.md"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), re.DOTALL)


@pytest.mark.parametrize("index", range(2))
def test_every_python_block_runs(index: int) -> None:
    assert len(blocks("python")) == 2
    block = blocks("python")[index]
    run = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    if index == 0:
        assert run.stdout == "MeteredSemaphore: no slot within the deadline, 0.05 s\n"


def test_the_yaml_block_is_a_settings_file(tmp_path: Path) -> None:
    [block] = blocks("yaml")
    path = tmp_path / "limits.yaml"
    path.write_text(block)
    [route] = ConcurrencySettings.from_file(path).routes
    assert route.deadline == "header:x-request-deadline-ms"
