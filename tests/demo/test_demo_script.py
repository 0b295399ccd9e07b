"""./scripts/demo, the README's "start the demo" command: it starts the fake model and the demo,
serves an episode, and leaves nothing running when it is stopped: by Ctrl-C, by `kill <the pid
it prints>`, and by the README's commands for a demo in the background (issue 33).

It runs with DEMO_SKIP_INSTALL=1 on a venv whose python refuses pip: the test reuses the venv it
runs from, and must never reinstall the project into it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from demo_processes import REPO, clean_env, free_port, wait_for

EPISODE = {
    "episode_id": "e1",
    "task": {"task_id": "t1", "prompt": "The answer is 42", "expected": "42"},
}


def venv_refusing_pip(root: Path) -> Path:
    """A venv-shaped folder whose bin/python is this interpreter, except that `-m pip` fails."""
    python = root / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(
        "#!/bin/sh\n"
        'case " $* " in *" -m pip "*) echo "the demo script ran pip" >&2; exit 97;; esac\n'
        f'exec "{sys.executable}" "$@"\n'
    )
    python.chmod(0o755)
    return root


def refused(url: str) -> bool:
    try:
        httpx.get(url, timeout=1)
    except httpx.ConnectError:
        return True
    return False


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM])
def test_the_demo_script_serves_an_episode_and_cleans_up(tmp_path: Path, stop_signal: int):
    demo_port, model_port = free_port(), free_port()
    venv = venv_refusing_pip(tmp_path / "venv")
    env = clean_env(
        PYTHON=sys.executable,
        VENV=str(venv),
        DEMO_SKIP_INSTALL="1",
        DEMO_PORT=str(demo_port),
        FAKE_MODEL_PORT=str(model_port),
    )
    log = (tmp_path / "demo-script.log").open("wb")
    # Ctrl-C in a terminal: the script must not inherit SIGINT ignored, as it would from a
    # test run started in the background of a non-interactive shell (bash cannot trap a
    # signal ignored at its start); a handler here is reset to the default in the child.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        script = subprocess.Popen(
            [str(REPO / "scripts" / "demo")],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    finally:
        if previous is not None:  # (None: a handler not set from Python, left as it was)
            signal.signal(signal.SIGINT, previous)
    demo, model = f"http://127.0.0.1:{demo_port}", f"http://127.0.0.1:{model_port}"
    try:
        wait_for(
            lambda: script.poll() is not None or not refused(f"{demo}/concurrency"),
            60,
            "the demo to start",
        )
        assert script.poll() is None, (tmp_path / "demo-script.log").read_text()
        response = httpx.post(f"{demo}/run", json=EPISODE, timeout=10)
        assert response.json()["result"]["reward"] == 1.0
        assert httpx.get(f"{model}/health", timeout=5).status_code == 200
        script.send_signal(stop_signal)
        try:
            code = script.wait(timeout=30)
        except subprocess.TimeoutExpired:
            stuck = (tmp_path / "demo-script.log").read_text()
            raise AssertionError(f"the demo did not stop within 30 s:\n{stuck}") from None
        assert code == 128 + stop_signal
    finally:
        if script.poll() is None:
            script.kill()
            script.wait()
        log.close()
    assert refused(f"{demo}/concurrency")
    assert refused(f"{model}/health")
    output = (tmp_path / "demo-script.log").read_text()
    assert f"status:   http://127.0.0.1:{demo_port}/concurrency" in output
    assert f"Ctrl-C (or kill {script.pid}) stops the demo and the fake model." in output


def readme_background_commands() -> tuple[str, str]:
    """The README's two commands that start the demo in the background and stop it."""
    readme = (REPO / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, re.S)
    [block] = [block for block in blocks if "./scripts/demo &" in block]
    start, stop = block.strip().splitlines()
    return start, stop


def processes_in(environment: str) -> dict[int, str]:
    """Running processes whose environment has `environment` (NAME=value): pid -> command."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and environment.encode() in (
                (entry / "environ").read_bytes().split(b"\0")
            ):
                found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return {pid: command.decode(errors="replace") for pid, command in found.items()}


@pytest.mark.parametrize("job_control", [True, False], ids=["terminal", "no-job-control"])
def test_the_readme_s_background_demo_stops_with_its_kill(tmp_path: Path, job_control: bool):
    start, stop = readme_background_commands()
    assert start.partition("#")[0].strip() == "./scripts/demo &"
    demo_port, model_port = free_port(), free_port()
    venv = venv_refusing_pip(tmp_path / "venv")  # in the environment of all it starts
    env = clean_env(
        PYTHON=sys.executable,
        VENV=str(venv),
        DEMO_SKIP_INSTALL="1",
        DEMO_PORT=str(demo_port),
        FAKE_MODEL_PORT=str(model_port),
    )
    # The README's lines as typed in a terminal (job control on, as in an interactive shell),
    # the stop sent once the demo serves.
    shell = ("set -m\n" if job_control else "") + f"{start}\nread -r _\n{stop}\nwait\n"
    log_path = tmp_path / "shell.log"
    with log_path.open("wb") as log:
        bash = subprocess.Popen(
            ["bash", "-c", shell],
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    demo = f"http://127.0.0.1:{demo_port}"
    started = f"VENV={venv}"
    try:
        wait_for(lambda: not refused(f"{demo}/concurrency"), 60, "the demo to start")
        response = httpx.post(f"{demo}/run", json=EPISODE, timeout=10)
        assert response.json()["result"]["reward"] == 1.0
        assert bash.stdin is not None
        bash.stdin.write(b"\n")
        bash.stdin.close()
        assert bash.wait(timeout=30) == 0, log_path.read_text()
        wait_for(lambda: not processes_in(started), 10, "the demo and its fake model to stop")
    finally:
        if bash.poll() is None:
            bash.kill()
            bash.wait()
        left = processes_in(started)
        for pid in left:  # what the stop did not stop (started by this test: its VENV)
            os.kill(pid, signal.SIGKILL)
    assert not left, f"still running: {left}\n{log_path.read_text()}"
    assert refused(f"{demo}/concurrency")
    assert refused(f"http://127.0.0.1:{model_port}/health")
