"""The structure the project keeps: small library files, few `type: ignore`, and mypy strict
over the core and the middleware alike (ruff and mypy themselves run in scripts/test)."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = sorted([*(ROOT / "gym_concurrency").rglob("*.py"), *(ROOT / "middleware").rglob("*.py")])
MAX_LINES = 450
MAX_TYPE_IGNORES = 3
MAX_BENCHMARK_RESULTS_KIB = 150


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


def test_benchmark_summaries_in_git_stay_small():
    """Raw runs stay out of git and superseded summaries leave it (benchmarks/README.md)."""
    listed = subprocess.run(
        ["git", "ls-files", "benchmarks/results"], cwd=ROOT, capture_output=True, text=True
    )
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    files = [ROOT / name for name in listed.stdout.split()]
    assert all(path.name.endswith(".summary.json") for path in files), files
    # Counted as `du` does (4 KiB blocks), which is what a checkout costs.
    kib = sum(-(-path.stat().st_size // 4096) * 4 for path in files if path.exists())
    assert kib <= MAX_BENCHMARK_RESULTS_KIB, f"{kib} KiB of benchmark summaries in git"


def test_the_readme_layout_names_every_library_module():
    """The README's Layout map matches the tree: each module of a package is named in that
    package's part of the map (issue 34)."""
    readme = (ROOT / "README.md").read_text()
    layout = readme.split("## Layout", 1)[1].split("```")[1]
    parts = re.split(r"^(?=\S)", layout, flags=re.M)  # one part per top-level folder
    for package in ("gym_concurrency", "middleware"):
        part = next(p for p in parts if p.startswith(f"{package}/"))
        named = set(re.findall(r"[\w.]+\.(?:py|html)\b", part))
        files = {
            path.name
            for path in (ROOT / package).rglob("*")
            if path.suffix in {".py", ".html"} and path.name != "__init__.py"
        }
        assert files - named == set(), f"README Layout, {package}/: not named"
        assert named - files - {"__init__.py"} == set(), f"README Layout, {package}/: gone"


def test_test_modules_have_names_of_their_own():
    # pytest imports a test module by its file name where its directory is not a package: two
    # of one name in different directories stop the whole run at collection.
    seen: dict[str, list[str]] = {}
    for path in (ROOT / "tests").rglob("test_*.py"):
        if not (path.parent / "__init__.py").exists():
            seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}
