"""scripts/test, the README's test command (and CI's): it says each set-up step as scripts/demo
does, keeps pip's, setuptools' and apt's output back unless the step fails (then shows it),
and can run again (issue 19, item 6). Before, a first run printed nothing of its own and 33
lines of pip and setuptools warnings.

The script runs for real (bash, ruff, mypy and a small pytest run on this interpreter), on a
venv whose python stands in for pip (and for `python -m venv`): the real pip would reinstall
the project into the venv these tests run from. apt-get is stood in for the same way."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
NOISE = "BuildBackendWarning: Editable installation (pip noise)"
# A python that is this interpreter, except `-m pip` (noise on stderr, then FAKE_PIP_STATUS)
# and `-m venv DIR` (DIR/bin/python: this same stand-in).
PYTHON = f"""#!/bin/sh
case "$1 $2" in
"-m pip")
    echo "pip $*" >>"$FAKE_LOG"
    echo "{NOISE}" >&2
    exit "${{FAKE_PIP_STATUS:-0}}";;
"-m venv")
    mkdir -p "$3/bin" "$3/lib/python3/site-packages/pip" && cp "$0" "$3/bin/python"
    echo "venv $3" >>"$FAKE_LOG"
    exit 0;;
"-m ensurepip")
    mkdir -p "$(dirname "$0")/../lib/python3/site-packages/pip"
    echo "ensurepip $*" >>"$FAKE_LOG"
    exit 0;;
esac
exec "{sys.executable}" "$@"
"""
APT_GET = f"""#!/bin/sh
echo "apt-get $*" >>"$FAKE_LOG"
echo "Reading package lists... (apt noise)"
echo "{NOISE}" >&2
exit "${{FAKE_APT_STATUS:-0}}"
"""
SMALL_TEST = "tests/core/test_contract.py"


def stand_in(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def run(script: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "VENV"))}
    environ.update(env)
    return subprocess.run(
        [str(REPO / "scripts" / script), *args],
        cwd=REPO,
        env=environ,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_whole_suite_says_first_how_long_it_takes(tmp_path: Path):
    # No arguments: the whole suite (PYTEST_ADDOPTS narrows it here, unseen by the script).
    python = stand_in(tmp_path / "python", PYTHON)
    env = {"PYTHON": str(python), "VENV": str(tmp_path / "venv"), "FAKE_LOG": str(tmp_path / "log")}
    done = run("test", PYTEST_ADDOPTS=f"-q -p no:cacheprovider {SMALL_TEST}", **env)
    assert done.returncode == 0, done.stdout + done.stderr
    first = done.stdout.splitlines()[0]
    version = "{}.{}".format(*sys.version_info[:2])
    minutes = "30-35" if sys.version_info >= (3, 13) else "20-25"  # as the README says
    assert first.startswith(f"test: the whole suite on Python {version}: about {minutes} minutes")


def test_a_first_run_says_each_step_and_keeps_pip_s_output_back(tmp_path: Path):
    python = stand_in(tmp_path / "python", PYTHON)
    venv, log = tmp_path / "venv", tmp_path / "calls.log"
    env = {"PYTHON": str(python), "VENV": str(venv), "FAKE_LOG": str(log)}

    first = run("test", "-q", "-p", "no:cacheprovider", SMALL_TEST, **env)
    assert first.returncode == 0, first.stdout + first.stderr
    lines = first.stdout.splitlines()
    version = "{}.{}".format(*sys.version_info[:2])
    assert lines[0] == f"test: creating the venv {venv} ({python})"
    assert lines[1] == f"test: upgrading pip in {venv}"
    assert lines[2].startswith(f"test: installing the project with its test extras into {venv}")
    if sys.version_info >= (3, 13):  # NeMo Gym's wheel: installed (pip stood in) once
        assert f"test: installing NeMo Gym 0.7.0 into {venv} (for tests/nemo_gym)" in lines
    assert f"test: ruff check and ruff format --check (python {version})" in lines
    assert f"test: mypy (python {version})" in lines
    assert f"test: pytest -q -p no:cacheprovider {SMALL_TEST} (python {version})" in lines
    assert NOISE not in first.stdout + first.stderr
    assert " passed" in first.stdout  # pytest's own output is never held back
    calls = log.read_text().splitlines()
    assert calls[0] == f"venv {venv}"
    assert any("install --quiet --disable-pip-version-check -e .[test]" in c for c in calls)

    again = run("test", "-q", "-p", "no:cacheprovider", SMALL_TEST, **env)  # idempotent
    assert again.returncode == 0, again.stdout + again.stderr
    assert "creating the venv" not in again.stdout
    assert again.stdout.splitlines()[0].startswith("test: installing the project")
    assert "NeMo Gym" not in again.stdout  # there already
    assert NOISE not in again.stdout + again.stderr


def test_a_venv_left_without_pip_gets_pip(tmp_path: Path):
    """A first run stopped while `python -m venv` ran leaves a python and no pip: the next
    run adds pip (keeping the venv) instead of failing with "No module named pip"."""
    python = stand_in(tmp_path / "python", PYTHON)
    venv, log = tmp_path / "venv", tmp_path / "calls.log"
    stand_in(venv / "bin" / "python", PYTHON)
    kept = venv / "kept.txt"
    kept.write_text("the venv's own")
    again = run("test", SMALL_TEST, PYTHON=str(python), VENV=str(venv), FAKE_LOG=str(log))
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.splitlines()[0] == f"test: installing pip into {venv} (it has none)"
    assert log.read_text().splitlines()[0] == "ensurepip -m ensurepip --upgrade"
    assert kept.read_text() == "the venv's own"
    second = run("test", SMALL_TEST, PYTHON=str(python), VENV=str(venv), FAKE_LOG=str(log))
    assert second.returncode == 0, second.stdout + second.stderr
    assert "installing pip" not in second.stdout  # there now


def test_a_failing_install_shows_pip_s_output_and_stops(tmp_path: Path):
    python = stand_in(tmp_path / "python", PYTHON)
    venv, log = tmp_path / "venv", tmp_path / "calls.log"
    stand_in(venv / "bin" / "python", PYTHON)
    (venv / "lib" / "python3" / "site-packages" / "pip").mkdir(parents=True)
    failed = run(
        "test",
        SMALL_TEST,
        PYTHON=str(python),
        VENV=str(venv),
        FAKE_LOG=str(log),
        FAKE_PIP_STATUS="1",
    )
    assert failed.returncode != 0
    assert NOISE in failed.stderr
    assert "test: installing the project with its test extras failed" in failed.stderr
    assert "test: ruff" not in failed.stdout  # nothing runs after a failed step


def path_without(tmp_path: Path, missing: str) -> str:
    """A PATH with the tools install-system-deps uses, apt-get stood in, and `missing` not
    on it (so it is installed)."""
    tools = tmp_path / "bin"
    stand_in(tools / "apt-get", APT_GET)
    for tool in (
        "bash",
        "sh",
        "id",
        "cat",
        "env",
        "prometheus",
        "promtool",
        "chromium",
        "redis-server",
        "openssl",
        "curl",
    ):
        found = shutil.which(tool)
        if tool != missing and found is not None:
            (tools / tool).symlink_to(found)
    return str(tools)


@pytest.mark.skipif(os.geteuid() != 0, reason="install-system-deps installs only as root")
def test_apt_says_what_it_installs_and_shows_its_output_only_when_it_fails(tmp_path: Path):
    log = tmp_path / "calls.log"
    path = path_without(tmp_path, "redis-server")
    installed = run("install-system-deps", "test", PATH=path, FAKE_LOG=str(log))
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert installed.stdout == "test: installing system packages (apt): redis-server\n"
    assert "noise" not in installed.stdout + installed.stderr
    assert "install -y -qq --no-install-recommends redis-server" in log.read_text()

    failed = run("install-system-deps", "test", PATH=path, FAKE_LOG=str(log), FAKE_APT_STATUS="100")
    assert failed.returncode != 0
    assert "apt noise" in failed.stderr
    assert NOISE in failed.stderr
    assert "test: apt-get update failed" in failed.stderr


def test_apt_is_not_run_when_every_package_is_there(tmp_path: Path):
    log = tmp_path / "calls.log"
    quiet = run("install-system-deps", "test", PATH=path_without(tmp_path, ""), FAKE_LOG=str(log))
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "", "")
    assert not log.exists()
