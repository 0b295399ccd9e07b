"""The files the library reads that are not Python modules are installed with it: a wheel
built from this tree, installed on its own, gives a shared limit its Lua scripts."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_CHECK = """
import sys
sys.path.insert(0, sys.argv[1])
from gym_concurrency.limits.shared import scripts
assert scripts.__file__.startswith(sys.argv[1]), scripts.__file__
for name in ("ACQUIRE", "REMOVE", "LEAVE", "SYNC", "CONFIGURE"):
    text = getattr(scripts, name)
    assert "local function grant()" in text and text.rstrip().endswith(")"), name
assert "run_id" in scripts.CHECK_SERVER
print("ok")
"""


def test_a_wheel_install_finds_the_lua_scripts(tmp_path: Path) -> None:
    source = tmp_path / "source"  # (a copy: the build writes build/ and egg-info beside it)
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for package in ("gym_concurrency", "middleware"):
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__py*"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    subprocess.run([*pip, "wheel", "--no-deps", "-w", tmp_path / "dist", source], check=True)
    (wheel,) = (tmp_path / "dist").glob("gym_concurrency-*.whl")
    site = tmp_path / "site"
    subprocess.run([*pip, "install", "--no-deps", "--target", site, wheel], check=True)
    shutil.rmtree(source)  # nothing can be read from the tree it was built from
    checked = subprocess.run(
        [sys.executable, "-c", _CHECK, str(site)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.stdout.strip() == "ok", checked.stderr
