"""NeMo Gym's own CLI over the example stack (examples/nemo_gym, docs/nemo-gym.md).

`GymStack` copies examples/ to a folder, links this venv into each server's folder with the
doc's own command, runs `gym env start` (a subprocess in its own process group, on a free
head-server port) and `gym eval run --no-serve` against it; each server's limits are read from
its status view.
`FakeUpstream` serves examples/fastapi_app/fake_model in this process behind a door that counts
every attempt (and the distinct calls among them: a retry sends the same body) and answers 429
with Retry-After past its capacity. Python >= 3.13 (NeMo Gym) only.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from examples.fastapi_app import fake_model
from tests.servers import UvicornServer, free_port

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "nemo-gym.md"
SERVERS = {  # config name -> its folder, as stack.yaml declares them
    "math_env": "environment_servers/math_env",
    "policy_model": "responses_api_models/policy_model",
    "math_verifier": "resources_servers/math_verifier",
}
START_SECONDS = 240.0  # Ray and three servers on a busy 2-core machine
_FINISHED = re.compile(r"Finished (\d+) / (\d+) rollouts \(100%\) in \S+ \(([\d.]+) rollouts/min\)")


class UpstreamDoor:
    """ASGI wrapper of the fake model: counts attempts on its generation routes (and the
    distinct bodies among them), refuses with 429 past `capacity` in flight."""

    def __init__(self, app: ASGIApp, capacity: int) -> None:
        self.app = app
        self.capacity = capacity
        self.inside = 0
        self.attempts = 0
        self.refused = 0
        self.bodies: set[str] = set()

    def reset(self) -> None:
        self.attempts = self.refused = 0
        self.bodies.clear()

    @property
    def calls(self) -> int:
        """Distinct calls: a retry sends the body of its first attempt again."""
        return len(self.bodies)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].endswith(("/responses", "/completions")):
            await self.app(scope, receive, send)
            return
        self.attempts += 1
        messages = [await receive()]
        while messages[-1].get("more_body"):
            messages.append(await receive())
        self.bodies.add(hashlib.sha256(b"".join(m.get("body", b"") for m in messages)).hexdigest())
        if self.inside >= self.capacity:
            self.refused += 1
            headers = [(b"retry-after", b"1"), (b"content-type", b"application/json")]
            await send({"type": "http.response.start", "status": 429, "headers": headers})
            await send({"type": "http.response.body", "body": b'{"error": "over capacity"}'})
            return

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        self.inside += 1
        try:
            await self.app(scope, replay, send)
        finally:
            self.inside -= 1


@contextmanager
def fake_upstream(latency_seconds: float, capacity: int) -> Iterator[tuple[str, UpstreamDoor]]:
    """The fake model at `latency_seconds` per call behind an UpstreamDoor: (its /v1 URL, door)."""
    fake_model.LATENCY_SECONDS = latency_seconds
    door = UpstreamDoor(fake_model.app, capacity)
    with UvicornServer(door, lifespan="off") as server:
        yield f"{server.url}/v1", door


@dataclass
class EvalRun:
    """One `gym eval run`: its exit status, output, and the rows it wrote."""

    returncode: int
    log: str
    rollouts: list[dict[str, Any]]
    failures: list[dict[str, Any]]
    seconds: float  # the whole command

    @property
    def collection_seconds(self) -> float | None:
        """The collection's own wall time, from its last progress line (completed / rate)."""
        finished = _FINISHED.findall(self.log)
        if not finished:
            return None
        done, _, per_minute = finished[-1]
        return int(done) / float(per_minute) * 60.0


@dataclass
class GymStack:
    """`gym env start <start_args>` over a copy of the example stack in `folder`, its head
    server on a free port; `config` (Hydra overrides, the same for every command) after them."""

    folder: Path
    start_args: list[str]
    config: list[str] = field(default_factory=list)
    head_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def stack(self) -> Path:
        """The copy of examples/nemo_gym the commands run in."""
        return self.folder / "examples" / "nemo_gym"

    @property
    def log_path(self) -> Path:
        return self.folder / "gym-env-start.log"

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def config_args(self) -> list[str]:
        return [*self.config, f"++head_server.port={self.head_port}"]

    def __enter__(self) -> GymStack:
        ignore = shutil.ignore_patterns(*_LOCAL_FILES)
        shutil.copytree(ROOT / "examples", self.folder / "examples", ignore=ignore)
        cd, link = doc_commands("Run it")[:2]  # cd examples/nemo_gym; link the venv
        venv = {**gym_env(), "VIRTUAL_ENV": sys.prefix}
        subprocess.run(["bash", "-c", f"{cd} && {link}"], cwd=self.folder, env=venv, check=True)
        for server_folder in SERVERS.values():
            assert (self.stack / server_folder / ".venv" / "bin" / "python").exists()
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [_gym(), "env", "start", *self.start_args, *self.config_args()],
                cwd=self.stack,
                env=gym_env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its servers and Ray share its process group
            )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_SECONDS
        url = f"http://127.0.0.1:{self.head_port}/readyz"
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                status = self.process.returncode
                raise AssertionError(f"gym env start exited with {status}:\n{self.log}")
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"gym env start not ready in {START_SECONDS} s:\n{self.log[-4000:]}")

    def server_urls(self) -> dict[str, str]:
        """Each server's URL, as the head server lists them."""
        instances = httpx.get(f"http://127.0.0.1:{self.head_port}/server_instances").json()
        return {i["process_name"]: i["url"] for i in instances}

    def limits(self) -> dict[str, dict[str, Any]]:
        """Every limit of every server now, by `server/limit_name`, from their status views."""
        rows = {}
        for name, url in self.server_urls().items():
            snapshot = httpx.get(f"{url}/concurrency", params={"format": "json"}).json()
            for row in snapshot["limits"]:
                rows[f"{name}/{row['limit_name']}"] = row
        return rows

    def eval_run(self, args: list[str], timeout: float = 600.0) -> EvalRun:
        """`gym eval run <args>` (with --no-serve and --output among them) on this stack."""
        output = args[args.index("--output") + 1]
        started = time.monotonic()
        done = subprocess.run(
            [_gym(), "eval", "run", *args, *self.config_args()],
            cwd=self.stack,
            env=gym_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            check=False,
        )
        seconds = time.monotonic() - started
        rollouts = self.stack / output
        failures = rollouts.with_name(rollouts.stem + "_failures.jsonl")
        return EvalRun(
            done.returncode,
            done.stdout.decode(errors="replace"),
            _rows(rollouts),
            _rows(failures),
            seconds,
        )

    def stop(self) -> None:
        """Ctrl-C, as a user stops it (the orchestrator stops its servers and Ray), then
        whatever of its process group is left, killed."""
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            with suppress(subprocess.TimeoutExpired):
                process.wait(30)
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # the group this stack started, by its id
        process.wait()
        self.process = None


# What a copy of the stack leaves out: links and outputs of earlier runs in the checkout.
_LOCAL_FILES = (".venv", "results", "outputs", "cache", "__pycache__")


def gym_env() -> dict[str, str]:
    """This environment with the venv's bin first on PATH, without GYM_CONCURRENCY_* / OTEL_*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GYM_CONCURRENCY_", "OTEL_"))}
    env["PATH"] = os.pathsep.join([str(Path(sys.prefix) / "bin"), env.get("PATH", "")])
    env.pop("PYTHONPATH", None)  # the checkout's own `benchmarks` would hide NeMo Gym's
    return env | doc_exports()


def doc_exports(section: str = "Run it") -> dict[str, str]:
    """The `export NAME=value` lines among the section's commands (Ray kept on 127.0.0.1)."""
    exports = [c.removeprefix("export ") for c in doc_commands(section) if c.startswith("export ")]
    return dict(word.split("=", 1) for line in exports for word in line.split())


def copied_server(name: str, copy_as: str, changes: Mapping[str, Any]) -> list[str]:
    """Hydra overrides adding to the stack a copy of its server `name` as `copy_as` (the same
    folder, so the same code), with `changes` (dotted keys in its config) made."""
    stack = yaml.safe_load((ROOT / "examples" / "nemo_gym" / "stack.yaml").read_text())
    [(kind, servers)] = stack[name].items()
    [(folder, config)] = servers.items()
    leaves = dict(_leaves(config))
    for key, value in changes.items():
        assert key in leaves or key.rsplit(".", 1)[0] in dict(_leaves(config, leaf=False)), key
        leaves[key] = value
    return [f"+{copy_as}.{kind}.{folder}.{key}={_hydra(v)}" for key, v in leaves.items()]


def _leaves(config: Mapping[str, Any], prefix: str = "", leaf: bool = True) -> Iterator[Any]:
    for key, value in config.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            if not leaf:
                yield path, value
            yield from _leaves(value, f"{path}.", leaf)
        elif leaf:
            yield path, value


def _hydra(value: Any) -> str:
    """`value` as a Hydra override value: strings quoted (a comma would be a sweep)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


def write_tasks(path: Path, count: int, taskset: str = "math") -> None:
    """`count` math tasks in NeMo Gym's materialized-task rows, of `taskset`."""
    with path.open("w") as tasks:
        for number in range(count):
            answer = 7 * number
            row = {
                "task_id": {"taskset": taskset, "task_id": str(number)},
                "task_input": {
                    "responses_create_params": {"input": f"Task {number}: the answer is {answer}."},
                    "expected_answer": str(answer),
                },
            }
            tasks.write(json.dumps(row) + "\n")


def doc_commands(section: str) -> list[str]:
    """The `$ ` commands of the console blocks under the doc's `## <section>` heading."""
    text = DOC.read_text().split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```console\n(.*?)```", text, re.S)
    return [line[2:] for block in blocks for line in block.splitlines() if line.startswith("$ ")]


def gym_args(command: str, subcommand: str, policy_base_url: str) -> list[str]:
    """The arguments after `gym <subcommand>` in a doc command, its policy_base_url replaced."""
    words = shlex.split(command)
    prefix = ["gym", *subcommand.split()]
    assert words[: len(prefix)] == prefix, command
    return [
        f"+policy_base_url={policy_base_url}" if word.startswith("+policy_base_url=") else word
        for word in words[len(prefix) :]
    ]


def _gym() -> str:
    return str(Path(sys.prefix) / "bin" / "gym")


def _rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
