"""docs/engine-signals.md as printed: its Python blocks run (the second against the fake
engine in a process of its own) and print what the doc says; its table of default names is
the one the code reads."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from gym_concurrency.engines import ENGINES, Gauge
from tests.engines.engine_process import fake_engine

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "engine-signals.md"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), re.DOTALL)


def run(block: str, **env: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", block],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, **env},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_reading_block_prints_what_the_doc_says() -> None:
    assert len(blocks("python")) == 3
    [printed] = blocks("text")
    assert run(blocks("python")[0]) == printed


def test_the_callers_block_follows_a_running_engine() -> None:
    with fake_engine("--batch", "8", "--service-ms", "20") as engine:
        assert run(blocks("python")[1], ENGINE=engine.base) == "stale=False scrapes>0=True\n"


def test_the_settings_block_runs() -> None:
    assert run(blocks("python")[2]) == ""


def written(gauge: Gauge | None) -> str:
    assert gauge is not None
    labels = ",".join(f'{name}="{value}"' for name, value in gauge.labels)
    return ", else ".join(
        f"`{name}{{{labels}}}`" if labels else f"`{name}`" for name in gauge.names
    )


def test_the_table_of_default_names_is_what_the_code_reads() -> None:
    rows = re.findall(
        r'^\| `"([a-z-]+)"`(?: \(default\))? \| (.*) \| (.*) \| (.*) \|$',
        DOC.read_text(),
        re.MULTILINE,
    )
    table = {engine: tuple(cells) for engine, *cells in rows}
    assert table == {
        name: (written(m.waiting), written(m.cache_usage), written(m.running))
        for name, m in ENGINES.items()
    }
