"""docs/rate-budgets.md as printed: every Python block runs, and its table of measured figures
is what tests/core/test_rate_budget_use.py measures."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.core.test_rate_budget_use import served

DOC = Path(__file__).resolve().parent.parent / "docs" / "rate-budgets.md"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), re.DOTALL)


def test_the_doc_has_the_blocks_these_tests_run() -> None:
    assert len(blocks("python")) == 6


@pytest.mark.parametrize("index", range(6))
def test_every_python_block_runs(index: int) -> None:
    run = subprocess.run(
        [sys.executable, "-c", blocks("python")[index]], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr


def test_the_table_says_what_is_measured() -> None:
    rows = re.findall(
        r"^\| (sliding|bucket) \| (sliding window|token bucket) \| ([0-9.]+) \|",
        DOC.read_text(),
        re.M,
    )
    assert len(rows) == 4
    for shape, meter, share in rows:
        measured, _ = served(shape, "sliding" if meter == "sliding window" else "bucket")
        assert round(measured, 2) == float(share), (shape, meter, measured)
