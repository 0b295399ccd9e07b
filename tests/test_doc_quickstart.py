"""docs/quickstart.md as a newcomer runs it (issue 33): the app it shows is
examples/quickstart/app.py, started by the page's own uvicorn command; then the page's
commands, in order, in one bash, each printing what the page says it prints (the `# ` lines
after it, where `...` stands for any text)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.demo.demo_processes import REPO, clean_env, require_binary, running
from tests.servers import free_port

DOC = REPO / "docs" / "quickstart.md"
APP = REPO / "examples" / "quickstart" / "app.py"
PAGE_URL, PAGE_PORT = "http://127.0.0.1:8000", "--port 8000"
# Printed by the test's bash before each block, to cut its output into the blocks' outputs.
MARK = "=== quickstart block"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), re.DOTALL)


def expected_lines(block: str) -> list[str]:
    """What the page says a block prints: its lines that are comments, without the `# `."""
    return [line[2:] for line in block.splitlines() if line.startswith("# ")]


def shows(expected: list[str], output: str) -> bool:
    """Whether each expected line matches its own line of `output` (in any order: `...` is any
    text) and no line is left over, unless the page trims the output with a `...` line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    trimmed = "..." in (line.strip() for line in expected)
    for line in (line.strip() for line in expected if line.strip() != "..."):
        pattern = re.compile(".*".join(map(re.escape, line.split("..."))))
        found = next((i for i, actual in enumerate(lines) if pattern.fullmatch(actual)), None)
        if found is None:
            return False
        del lines[found]
    return trimmed or not lines


def test_shows_matches_trimmed_lines_and_nothing_else() -> None:
    assert shows(["  3 a ... 200", "b"], "b\n      3 a long line 200\n")
    assert not shows(["3 a ... 200"], "3 a long line 503\n")
    assert not shows(["b"], "b\nan extra line\n")
    assert shows(["b", "..."], "b\nan extra line\n")
    assert not shows(["b", "b"], "b\n")


def test_the_page_shows_the_app_as_it_is() -> None:
    assert blocks("python") == [APP.read_text()]


def distributions(extra: str) -> set[str]:
    """The distributions `pip install ".[extra]"` asks for, through this project's own extras."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    found = set()
    for requirement in extras[extra]:
        name = re.split(r"[\[<>=~! ;]", requirement, maxsplit=1)[0]
        if name == "gym-concurrency":
            for ours in re.findall(r"\[(.*?)\]", requirement)[0].split(","):
                found |= distributions(ours.strip())
        else:
            found.add(name)
    return found


def test_the_install_line_brings_what_the_app_and_its_command_need() -> None:
    install, start = blocks("bash")[0].splitlines()
    assert install == 'pip install -e ".[demo]"'
    assert start.startswith("uvicorn examples.quickstart.app:app")
    imported = {"fastapi", "httpx", "pydantic", "prometheus-client", "opentelemetry-sdk"}
    imported |= {"opentelemetry-exporter-prometheus", "uvicorn"}  # and the command
    assert imported <= distributions("demo")


def test_every_command_prints_what_the_page_says(tmp_path: Path) -> None:
    require_binary("curl")
    start, *commands = blocks("bash")
    assert len(commands) == 6
    assert all(expected_lines(block) for block in commands)  # each says what it prints
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = shlex.split(start.splitlines()[-1].replace(PAGE_PORT, f"--port {port}"))
    assert f"--port {port}" in shlex.join(argv)
    bin_dir = str(Path(sys.executable).parent)  # `uvicorn` is this venv's
    env = clean_env(PATH=os.pathsep.join([bin_dir, os.environ.get("PATH", "")]))
    script = "".join(
        f"echo '{MARK} {index}'\n{block.replace(PAGE_URL, url)}"
        for index, block in enumerate(commands)
    )
    assert PAGE_URL not in script
    with running("quickstart", argv, env, tmp_path, f"{url}/concurrency") as server:
        ran = subprocess.run(
            ["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120
        )
    assert ran.returncode == 0, ran.stderr
    outputs = re.split(rf"^{MARK} \d+\n", ran.stdout, flags=re.M)[1:]
    assert len(outputs) == len(commands), ran.stdout
    for block, output in zip(commands, outputs, strict=True):
        expected = expected_lines(block)
        said = "\n".join(expected)
        assert shows(expected, output), f"the block\n{block}\nprinted\n{output}\nnot\n{said}"
    assert "Traceback" not in server.log(), server.log()
