"""The structure the project keeps: small library files, few `type: ignore`, and mypy strict
over the core and the middleware alike (ruff and mypy themselves run in scripts/test)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = sorted([*(ROOT / "gym_concurrency").rglob("*.py"), *(ROOT / "middleware").rglob("*.py")])
MAX_LINES = 450
MAX_TYPE_IGNORES = 3


def test_every_library_file_is_small():
    long = {
        str(path.relative_to(ROOT)): n
        for path in LIBRARY
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}, f"files over {MAX_LINES} lines: split them by concept"


def test_type_ignores_are_few():
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in LIBRARY
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "type: ignore" in line
    ]
    assert len(found) <= MAX_TYPE_IGNORES, found


def test_mypy_is_strict_over_the_core_and_the_middleware():
    mypy = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert mypy["strict"] is True
    assert set(mypy["files"]) == {"gym_concurrency", "middleware"}
    assert not any(o.get("strict") is False for o in mypy.get("overrides", []))
