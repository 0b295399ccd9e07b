"""The example NeMo Gym servers' requirements.txt can be installed: gym-concurrency is not on
the package index, so each names this checkout by a path from its own folder; pip resolves it
there to this project, with the extras the servers import."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PIP_DRY_RUN = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--quiet"]
PIP_DRY_RUN += ["--disable-pip-version-check", "--report", "-"]
REQUIREMENTS = sorted((ROOT / "examples" / "nemo_gym").glob("*/*/requirements.txt"))


@pytest.mark.parametrize("requirements", REQUIREMENTS, ids=lambda p: p.parent.name)
def test_the_gym_concurrency_line_installs_this_checkout(requirements: Path):
    lines = [line for line in requirements.read_text().splitlines() if line and line[0] != "#"]
    ours = [line for line in lines if not line.startswith("nemo-gym")]
    assert len(ours) == 1, lines
    done = subprocess.run(
        [*PIP_DRY_RUN, ours[0]],
        cwd=requirements.parent,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    [item] = json.loads(done.stdout)["install"]
    assert item["metadata"]["name"] == "gym-concurrency"
    assert set(item["requested_extras"]) == {"fastapi", "httpx"}
    assert item["download_info"]["url"] == ROOT.as_uri()
