"""NeMo Gym as shipped, under `gym-concurrency-nemo-gym` (docs/nemo-gym.md, "NeMo Gym as
shipped"): `gym env start` over examples/nemo_gym/shipped (the wheel's openai_model and
math_with_judge, and an environment server written with NeMo Gym alone), and `gym eval run`
against it, each under the console script or not. Every limit is read from the seed's console
lines the processes print (`console_line`). Python >= 3.13 (NeMo Gym) only.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import warnings
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.nemo_gym.gym_stack import EvalRun, doc_commands, doc_exports, gym_env
from tests.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
# Each server's venv, where stack.yaml's `uv_venv_dir: venvs` makes `gym env start` look.
VENV_FOLDERS = (
    "environment_servers/plain_math_env",
    "responses_api_models/openai_model",
    "resources_servers/math_with_judge",
)
START_SECONDS = 240.0
# What a driver's log ends with when it read no JSON config from the head server.
HEAD_CONFIG_UNREAD = b"in load_from_global_config"
# `<server> [<component>, <limit_name>(, <server>)] limit=.. active=.. ...`
LINE = re.compile(r"(\S+) \[([^\]]+)\] (limit=\d+ active=\d+ available=\d+ queue_depth=\d+[^\n]*)")


@dataclass(frozen=True)
class LimitLine:
    """One console line: the limit's attributes and its numbers."""

    label: tuple[str, ...]  # (component, limit_name) or (component, limit_name, server)
    values: dict[str, int]

    @property
    def limit_name(self) -> str:
        return self.label[1]


def limit_lines(text: str) -> list[LimitLine]:
    """Every console line in `text`, in order."""
    found = []
    for _prefix, label, fields in LINE.findall(text):
        values = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", fields)}
        found.append(LimitLine(tuple(p.strip() for p in label.split(",")), values))
    return found


def write_tasks(path: Path, count: int) -> None:
    """`count` math tasks (taskset `math`) whose fake-model answer is right."""
    with path.open("w") as tasks:
        for number in range(count):
            answer = 7 * number
            task = {
                "responses_create_params": {"input": f"Task {number}: \\boxed{{{answer}}}"},
                "question": f"Task {number}",
                "expected_answer": str(answer),
            }
            row = {"task_id": {"taskset": "math", "task_id": str(number)}, "task_input": task}
            tasks.write(json.dumps(row) + "\n")


SECTION = "NeMo Gym as shipped"


def doc_gym_args(subcommand: str, telemetry: bool = False) -> list[str]:
    """The words of the section's `gym-concurrency-nemo-gym gym <subcommand> ...` command: the
    one with NeMo Gym's own telemetry (`telemetry.yaml` in its config_paths) or the other."""
    prefix = f"gym-concurrency-nemo-gym gym {subcommand} "
    [command] = [
        c
        for c in doc_commands(SECTION)
        if c.startswith(prefix) and ("telemetry.yaml" in c) == telemetry
    ]
    return shlex.split(command)


@dataclass
class ShippedStack:
    """The section's own commands, from a copy of the checkout's examples/ in `folder`: link the
    venvs, then `gym-concurrency-nemo-gym gym env start` (without the console script unless
    `opt_in`; the one with NeMo Gym's own telemetry if `telemetry`), its policy_base_url
    replaced, on a free head-server port, `config` (Hydra overrides) after the doc's."""

    folder: Path
    policy_base_url: str
    opt_in: bool = True
    telemetry: bool = False
    config: list[str] = field(default_factory=list)
    interval_ms: int = 200  # how often each process writes its console lines
    head_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def stack(self) -> Path:
        return self.folder / "examples" / "nemo_gym" / "shipped"

    @property
    def log(self) -> str:
        return (self.folder / "gym-env-start.log").read_text(errors="replace")

    def env(self) -> dict[str, str]:
        """gym_env() with the section's exports, console lines (and NeMo Gym's exporter, where
        it exports) every `interval_ms`."""
        return (
            gym_env()
            | doc_exports(SECTION)
            | {
                "GYM_CONCURRENCY_NEMO_GYM_EXPORT_INTERVAL": str(self.interval_ms),
                "OTEL_METRIC_EXPORT_INTERVAL": str(self.interval_ms),  # NeMo Gym's exporter
            }
        )

    def command(self, words: list[str]) -> list[str]:
        """A doc command's words, made to run here."""
        words = [
            f"+policy_base_url={self.policy_base_url}" if w.startswith("+policy_base_url=") else w
            for w in words
        ]
        bin_folder = Path(sys.prefix) / "bin"
        words[:2] = [str(bin_folder / words[0]), str(bin_folder / words[1])]
        if not self.opt_in:
            words = words[1:]
        return [*words, f"++head_server.port={self.head_port}", *self.config]

    def __enter__(self) -> ShippedStack:
        ignore = shutil.ignore_patterns("venvs", "results", "outputs", "__pycache__", ".venv")
        shutil.copytree(ROOT / "examples", self.folder / "examples", ignore=ignore)
        [cd] = [c for c in doc_commands(SECTION) if c.startswith("cd ")]
        [link] = [c for c in doc_commands(SECTION) if c.startswith("for server in ")]
        venv = self.env() | {"VIRTUAL_ENV": sys.prefix}
        subprocess.run(["bash", "-c", f"{cd} && {link}"], cwd=self.folder, env=venv, check=True)
        for server in VENV_FOLDERS:
            assert (self.stack / "venvs" / server / ".venv" / "bin" / "python").exists()
        with (self.folder / "gym-env-start.log").open("wb") as log:
            self.process = subprocess.Popen(
                self.command(doc_gym_args("env start", self.telemetry)),
                cwd=self.stack,
                env=self.env(),
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
        url = f"http://127.0.0.1:{self.head_port}/readyz"  # every server up
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(f"gym env start exited:\n{self.log[-4000:]}")
            with suppress(httpx.TransportError):
                if httpx.get(url, timeout=2).status_code == 200:
                    return
            time.sleep(0.5)
        raise AssertionError(f"gym env start not ready in {START_SECONDS} s:\n{self.log[-4000:]}")

    def eval_run(
        self,
        tasks: Path,
        output: str,
        *args: str,
        timeout: float = 600,
        env: dict[str, str] | None = None,
    ) -> EvalRun:
        """The section's `gym eval run` of `tasks` into `output`, `args` replacing its own
        (`--concurrency N`) or added (`--resume`), `env` added to its environment."""
        words = doc_gym_args("eval run", self.telemetry)
        words[words.index("--input") + 1] = str(tasks)
        words[words.index("--output") + 1] = output
        extra = list(args)
        if "--concurrency" in extra:
            at = extra.index("--concurrency")
            words[words.index("--concurrency") + 1] = extra[at + 1]
            del extra[at : at + 2]
        started = time.monotonic()
        done = self._run([*self.command(words), *extra], self.env() | (env or {}), timeout)
        if done.returncode != 0 and HEAD_CONFIG_UNREAD in done.stdout:
            # Once in a CI run (not here in dozens), the driver read no JSON from the head
            # server's /global_config_dict_yaml before sending a rollout: NeMo Gym's start-up,
            # not a limit's. Say what the head server answers now, and run the command again.
            warnings.warn(f"gym eval run read no config: {self._head_config()}", stacklevel=2)
            done = self._run([*self.command(words), *extra], self.env() | (env or {}), timeout)
        rollouts = self.stack / output
        failures = rollouts.with_name(rollouts.stem + "_failures.jsonl")
        return EvalRun(
            done.returncode,
            done.stdout.decode(errors="replace"),
            _rows(rollouts),
            _rows(failures),
            time.monotonic() - started,
        )

    def _run(
        self, words: list[str], env: dict[str, str], timeout: float
    ) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            words,
            cwd=self.stack,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            check=False,
        )

    def _head_config(self) -> str:
        """What the head server answers for the config the driver reads, in short."""
        try:
            reply = httpx.get(f"http://127.0.0.1:{self.head_port}/global_config_dict_yaml")
        except httpx.TransportError as error:
            return repr(error)
        return f"{reply.status_code} {reply.text[:200]!r}; server log: {self.log[-2000:]}"

    def cpu_seconds(self) -> dict[str, float]:
        """CPU time so far of each server of this stack (by its folder's name, with its reaped
        children: math_with_judge's verifier forks), and of the rest of its processes ("other")."""
        import psutil  # NeMo Gym's CLI depends on it

        assert self.process is not None
        found: dict[str, float] = {}
        for process in psutil.process_iter():
            try:
                if os.getpgid(process.pid) != self.process.pid:
                    continue
                times, cwd, words = process.cpu_times(), process.cwd(), process.cmdline()
            except (psutil.Error, ProcessLookupError):
                continue
            name = Path(cwd).name if "app.py" in words else "other"
            total = times.user + times.system + times.children_user + times.children_system
            found[name] = found.get(name, 0.0) + total
        return found

    def stop(self) -> None:
        """Ctrl-C, as a user stops it, then whatever of its process group is left, killed."""
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


def _rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
