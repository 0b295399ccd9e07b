"""One of NeMo Gym's own servers, from its wheel, run as `gym env start` runs it (its folder's
`python app.py`, the global config in NEMO_GYM_CONFIG_DICT, its name in NEMO_GYM_CONFIG_PATH)
under the opt-in, without Ray or a head server; and a fake engine that counts what reaches it.
Python >= 3.13 (NeMo Gym) only."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from gym_concurrency.middleware.nemo_gym_shipped.launch import environment
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tests.nemo_gym.gym_stack import gym_env
from tests.nemo_gym.shipped_stack import LimitLine, limit_lines
from tests.servers import free_port, terminate

SITE_PACKAGES = Path(next(p for p in sys.path if p.endswith("site-packages")))
START_SECONDS = 120.0


@dataclass
class FakeEngine:
    """An OpenAI-compatible engine (Chat Completions and the Responses API) that answers each
    call after `seconds`, counting the calls in flight at once."""

    seconds: float = 0.3
    text: str = "[[A=B]]"  # math_with_judge's judge: "equal"
    in_flight: int = 0
    peak: int = 0
    calls: int = 0

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/v1/responses", self.responses, methods=["POST"]),
            ]
        )

    async def _hold(self, request: Request) -> None:
        await request.body()
        self.in_flight += 1
        self.calls += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            await asyncio.sleep(self.seconds)
        finally:
            self.in_flight -= 1

    async def chat(self, request: Request) -> JSONResponse:
        await self._hold(request)
        message = {"role": "assistant", "content": self.text}
        return JSONResponse(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": "fake",
                "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )

    async def responses(self, request: Request) -> JSONResponse:
        await self._hold(request)
        return JSONResponse(response_body(self.text))


def response_body(text: str) -> dict[str, Any]:
    """A NeMoGymResponse whose one message is `text`."""
    content = [{"type": "output_text", "text": text, "annotations": []}]
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": time.time(),
        "model": "fake",
        "output": [
            {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": content,
            }
        ],
        "parallel_tool_calls": False,
        "tool_choice": "auto",
        "tools": [],
    }


@dataclass
class WheelServer:
    """The wheel's `<kind>/<folder>/app.py` serving as `name` on `port`, its log in `log`."""

    log: Path
    port: int
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def lines(self, limit_name: str) -> list[LimitLine]:
        """Its console lines for `limit_name`, so far."""
        text = self.log.read_text(errors="replace")
        return [line for line in limit_lines(text) if line.limit_name == limit_name]


@contextmanager
def wheel_server(
    kind: str, folder: str, name: str, config: dict[str, Any], others: dict[str, Any], tmp: Path
) -> Iterator[WheelServer]:
    """Run the wheel's server `kind/folder` as `name` with `config` (its own), `others` (the
    rest of the global config: the servers it calls), under the opt-in, console lines every
    100 ms; stopped (SIGTERM) after."""
    port = free_port()
    own = {"entrypoint": "app.py", "host": "127.0.0.1", "port": port} | config
    global_config = {
        "head_server": {"host": "127.0.0.1", "port": free_port()},
        "dry_run": False,
        name: {kind: {folder: own}},
    } | others
    server_folder = SITE_PACKAGES / kind / folder
    env = environment(gym_env()) | {
        "NEMO_GYM_CONFIG_DICT": yaml.safe_dump(global_config),
        "NEMO_GYM_CONFIG_PATH": name,
        "GYM_CONCURRENCY_NEMO_GYM_EXPORT_INTERVAL": "100",
        "GYM_CONCURRENCY_NEMO_GYM_EXPORTER": "console_line",
    }
    env["PYTHONPATH"] = f"{env['PYTHONPATH']}:{server_folder}"  # as `gym env start` adds it
    served = WheelServer(tmp / f"{name}.log", port)
    with served.log.open("wb") as log:
        served.process = subprocess.Popen(
            [sys.executable, "app.py"], cwd=server_folder, env=env, stdout=log, stderr=log
        )
    try:
        _wait_ready(served)
        yield served
    finally:
        terminate(served.process)


def _wait_ready(served: WheelServer) -> None:
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        assert served.process is not None
        if served.process.poll() is not None:
            raise AssertionError(f"the server exited:\n{served.log.read_text()[-4000:]}")
        with suppress(httpx.TransportError):
            httpx.get(f"{served.url}/health", timeout=2)  # any answer: it serves
            return
        time.sleep(0.3)
    raise AssertionError(f"not serving in {START_SECONDS} s:\n{served.log.read_text()[-4000:]}")
