"""docs/nemo-gym.md as printed. Its install commands work in a fresh venv made from a copy of
the checkout; every file it shows is the file in examples/nemo_gym; its fake-model command
serves what the stack's model server calls; its stack diagram is the stack NeMo Gym's
run_webserver builds around the example environment server, which limits /run for NeMo Gym's
collector; stack.yaml loads into each server's config; the warning it quotes is the one logged;
its operation_limit resources server masks a refused verification. Its `gym env start` and
`gym eval run` commands are run by tests/nemo_gym/test_rollout_run.py."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.nemo_gym.requires import skip_module_without_nemo_gym

skip_module_without_nemo_gym()

from fastapi import FastAPI  # noqa: E402
from gym_concurrency.middleware import (  # noqa: E402
    ConcurrencyLimitMiddleware,
    ConcurrencySettings,
    OperationLimit,
    RouteLimit,
)
from nemo_gym.config_types import BaseServerConfig, Domain  # noqa: E402
from nemo_gym.openai_utils import NeMoGymResponse  # noqa: E402
from nemo_gym.rollout_collection import _episode_record, _is_episode_response  # noqa: E402
from nemo_gym.server_utils import ServerClient  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from gym_concurrency import MeteredSemaphore  # noqa: E402
from gym_concurrency.limits import registered_limits  # noqa: E402
from tests.nemo_gym.environment import (  # noqa: E402
    Collector,
    build_app,
    episode_row,
    serve_on_this_loop,
)
from tests.nemo_gym.gym_stack import DOC, ROOT, SERVERS, doc_commands, gym_env  # noqa: E402
from tests.servers import eventually, free_port, wait_until  # noqa: E402

INSTALL_SECONDS = 900  # a fresh venv with NeMo Gym's dependencies (ray, pandas, ...): minutes


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), re.S)


def text_block(starting: str) -> str:
    """The doc's one text block that starts with `starting` (its lines unindented)."""
    [block] = [b for b in blocks("text") if b.lstrip().startswith(starting)]
    return "\n".join(line.strip() for line in block.splitlines() if line.strip())


def shown_files() -> dict[str, str]:
    """Each block the doc introduces with its file's path (`path`:), by path."""
    pattern = r"`(examples/[^`]+\.(?:py|yaml))`[^\n]*:\n\n```\w+\n(.*?)```"
    found = re.findall(pattern, DOC.read_text(), re.S)
    return dict(found)


def example(marker: str) -> dict[str, Any]:
    """Run the doc's python block containing `marker` as a module (pydantic resolves a model's
    annotations in its module); the module's namespace."""
    code = next(block for block in blocks("python") if marker in block)
    module = types.ModuleType(f"nemo_gym_doc_example_{len(sys.modules)}")
    sys.modules[module.__name__] = module
    exec(compile(code, str(DOC), "exec"), module.__dict__)
    return module.__dict__


def app_module(server: str) -> Any:
    """An example server's app.py, imported as a module (its __main__ block not run)."""
    path = ROOT / "examples" / "nemo_gym" / SERVERS[server] / "app.py"
    spec = importlib.util.spec_from_file_location(f"nemo_gym_doc_{server}", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def limit_of(server_name: str, limit_name: str) -> MeteredSemaphore:
    [limit] = [
        s for s in registered_limits() if s.server == server_name and s.limit_name == limit_name
    ]
    return limit


def stack_config(policy_base_url: str = "http://127.0.0.1:8000/v1") -> dict[str, Any]:
    """stack.yaml as NeMo Gym resolves it, with policy_base_url given."""
    config = OmegaConf.load(ROOT / "examples" / "nemo_gym" / "stack.yaml")
    config.policy_base_url = policy_base_url
    resolved = OmegaConf.to_container(config, resolve=True)
    assert isinstance(resolved, dict)
    return resolved


def server_config(stack: dict[str, Any], server: str, **given: Any) -> dict[str, Any]:
    """One server's config as NeMo Gym's loader hands it over: name, host and port added."""
    [kind] = stack[server]
    config = stack[server][kind][server]
    return {**config, "name": server, "host": "127.0.0.1", "port": 8000, **given}


def test_every_file_shown_is_the_example_file():
    shown = shown_files()
    assert set(shown) == {
        *(f"examples/nemo_gym/{folder}/app.py" for folder in SERVERS.values()),
        "examples/nemo_gym/stack.yaml",
        "examples/nemo_gym/shipped/telemetry.yaml",
    }
    for path, text in shown.items():
        assert text == (ROOT / path).read_text(), f"{path} differs from the doc's block"


def test_every_code_block_is_a_file_or_run_here():
    files = set(shown_files().values())
    others = [block for block in blocks("python") + blocks("yaml") if block not in files]
    [nemo_gym_import, operation_limit_example] = others
    assert "class MathResourcesServer(" in operation_limit_example  # run below
    # The import NeMo Gym's telemetry makes, as its wheel has it.
    import nemo_gym.telemetry.setup

    assert f"            {nemo_gym_import}" in Path(nemo_gym.telemetry.setup.__file__).read_text()
    assert len(blocks("text")) == 4  # the two tests below, test_shipped.py's and
    assert text_block("ServerErrorMiddleware")  # test_shipped_telemetry.py's
    assert text_block("gym_concurrency: route /run")
    assert text_block("driver [rollout_driver, rollouts]")
    assert text_block("INFO:gym_concurrency.nemo_gym:")


@pytest.mark.timeout(INSTALL_SECONDS + 120)
def test_the_install_commands_work_in_a_fresh_venv(tmp_path: Path):
    # A copy of the checkout (every file git would check out), the commands run as printed.
    checkout = tmp_path / "checkout"
    listed = (
        subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (checkout / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, checkout / name)
    commands = doc_commands("Install")
    assert commands[1] == '"$PYTHON" -m venv .venv'  # the Python the first line picks
    env = gym_env()
    env["PATH"] = f"{Path(sys.base_prefix) / 'bin'}:{env['PATH']}"  # python3.13: this Python
    env.pop("VIRTUAL_ENV", None)
    env["PIP_NO_COMPILE"] = "1"  # no .pyc for ray, pandas, ...: minutes less, the same install
    script = " && ".join([*commands, *_fresh_venv_checks()])
    done = subprocess.run(
        ["bash", "-c", script],
        cwd=checkout,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=INSTALL_SECONDS,
        check=False,
    )
    log = done.stdout.decode(errors="replace")
    assert done.returncode == 0, log[-6000:]
    assert "fresh venv: every server imports" in log


def _fresh_venv_checks() -> list[str]:
    """In the venv just made, from examples/nemo_gym as the doc runs it (at the checkout's root
    its `gym_concurrency/` folder would hide the installed package): NeMo Gym's CLI and rollout
    collection import, and every example server's app.py imports with all it needs (not run)."""
    apps = [f"{folder}/app.py" for folder in SERVERS.values()]
    code = (
        "import importlib.util, sys\n"
        "import nemo_gym.cli.env, nemo_gym.cli.eval, nemo_gym.rollout_collection\n"
        f"for number, path in enumerate({apps!r}):\n"
        "    spec = importlib.util.spec_from_file_location(f'app{number}', path)\n"
        "    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)\n"
        "    spec.loader.exec_module(module)\n"
        "assert sys.prefix.endswith('.venv'), sys.prefix\n"
        "print('fresh venv: every server imports')\n"
    )
    cd = doc_commands("Run it")[0]
    return [cd, "gym eval run --help > /dev/null", f"python -c {shlex.quote(code)}"]


@pytest.mark.parametrize("section", ["Run it", "NeMo Gym as shipped"])
def test_the_fake_model_command_serves_the_model_servers_calls(section: str, tmp_path: Path):
    # Run it's after its `cd examples/nemo_gym`; the shipped section's at the checkout's root.
    [command] = [c for c in doc_commands(section) if "fake_model:app" in c]
    cd = doc_commands("Run it")[0] if section == "Run it" else "true"
    port = free_port()
    assert command.endswith(" --port 8000 &")
    command = command.removesuffix(" --port 8000 &") + f" --port {port}"
    ignore = shutil.ignore_patterns(".venv")
    shutil.copytree(ROOT / "examples", tmp_path / "examples", ignore=ignore)
    env = {**gym_env(), "VIRTUAL_ENV": sys.prefix}
    fake = subprocess.Popen(
        ["bash", "-c", f"{cd} && {command}"], cwd=tmp_path, env=env, start_new_session=True
    )
    try:
        url = f"http://127.0.0.1:{port}/v1"
        wait_until(lambda: _answers(f"{url}/models"), 30, "the fake model to serve")
        reply = httpx.post(f"{url}/responses", json={"model": "m", "input": "the answer is 6."})
    finally:
        os.killpg(fake.pid, signal.SIGINT)  # the group this test started: bash and uvicorn
        fake.wait(10)
    assert NeMoGymResponse.model_validate(reply.json()).output_text == "the answer is 6."


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def environment_server(name: str, **config: Any) -> Any:
    """The example environment server, built as run_webserver builds it, its peers named."""
    module = app_module("math_env")
    stack = stack_config()
    peers = {  # as NeMo Gym's loader fills them in: with a host and port each
        peer: {kind: {peer: server_config(stack, peer)} for kind in stack[peer]}
        for peer in ("policy_model", "math_verifier")
    }
    client = ServerClient(
        head_server_config=BaseServerConfig(host="127.0.0.1", port=1),
        global_config_dict=OmegaConf.create(peers),
    )
    settings = module.MathEnvironmentServerConfig.model_validate(
        server_config(stack, "math_env", name=name, **config)
    )
    return module.MathEnvironmentServer(config=settings, server_client=client)


def test_the_stack_diagram_is_the_stack_run_webserver_builds(component: str):
    app = build_app(environment_server(component))
    built = []
    layer: Any = app.build_middleware_stack()
    while not built or built[-1] != "APIRouter":  # each layer's .app is the next one in
        built.append(type(layer).__name__)
        layer = layer.app
    diagram = text_block("ServerErrorMiddleware")
    documented = [line.split()[0] for line in diagram.splitlines()]
    assert built == documented


@pytest.mark.usefixtures("nemo_gym_http_client")
async def test_the_environment_server_refuses_run_as_a_non_terminal_failure(component: str):
    small = RouteLimit(
        path="/run",
        limit_name="episodes",
        max_concurrent=1,
        queue_timeout_seconds=0.05,
        failure="episode",
    )
    server = environment_server(component, episodes=small.model_dump())
    assert server._admission is None  # NeMo Gym's own admission is off
    async with serve_on_this_loop(build_app(server)) as port:
        await eventually(lambda: bool(_limits(component)), "the limits made at startup")
        slot = limit_of(component, "episodes")
        assert (slot.component, slot.limit) == ("environment_server", 1)
        await slot.acquire()  # the only slot is taken: the episode times out queued
        try:
            row = episode_row(task=2)
            row["task_input"] = {"responses_create_params": {"input": "1"}, "expected_answer": "1"}
            [(_, refused)] = await Collector().point_at(port).collect([row], within=10)
        finally:
            slot.release()
    assert _is_episode_response(refused)
    record = _episode_record(refused)
    assert record["_ng_failure_terminal"] is False
    assert record["_ng_failure_stage"] == "admission"
    assert record["_ng_failure_message"] == "Episode admission timed out"


def _limits(server_name: str) -> list[Any]:
    return [s for s in registered_limits() if s.server == server_name]


def test_stack_yaml_loads_into_each_servers_config():
    stack = stack_config()
    env = app_module("math_env").MathEnvironmentServerConfig.model_validate(
        server_config(stack, "math_env")
    )
    assert (env.max_concurrent_episodes, env.queue_timeout_seconds) == (None, None)
    assert env.episodes == RouteLimit(
        path="/run",
        limit_name="episodes",
        max_concurrent=8,
        queue_timeout_seconds=600,
        failure="episode",
    )
    model = app_module("policy_model").PolicyModelConfig.model_validate(
        server_config(stack, "policy_model")
    )
    assert model.openai_base_url == "http://127.0.0.1:8000/v1"
    assert (model.generation.max_concurrent, model.generation.failure) == (8, "openai")
    verifier = app_module("math_verifier").MathVerifierConfig.model_validate(
        server_config(stack, "math_verifier")
    )
    assert verifier.domain == Domain.MATH
    assert (verifier.verification.max_concurrent, verifier.verification.failure) == (8, "problem")
    classes = {"math_env": "MathEnvironmentServer", "policy_model": "PolicyModel"}
    classes["math_verifier"] = "MathVerifier"
    for server, name in classes.items():  # each server says it does not use Ray
        assert getattr(app_module(server), name).ray_enabled is False, server
    assert stack["environment_server_routes"] == {"math": "math_env"}


async def test_the_warning_quoted_is_the_one_logged(caplog: pytest.LogCaptureFixture):
    # The doc's numbers: 8 slots, 48 queued, one more arriving.
    route = RouteLimit(
        path="/run", limit_name="episodes", max_concurrent=8, max_queue=48, failure="episode"
    )
    app = FastAPI()
    release = asyncio.Event()

    @app.post("/run")
    async def run() -> dict[str, Any]:
        await release.wait()
        return {}

    component = "doc_warning"
    app.add_middleware(
        ConcurrencyLimitMiddleware,
        settings=ConcurrencySettings(component=component, routes=[route]),
    )
    caplog.set_level(logging.WARNING, logger="gym_concurrency.middleware")
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        held = [asyncio.create_task(client.post("/run", content=b"{}")) for _ in range(56)]
        await eventually(
            lambda: [(s.active, s.queue_depth) for s in _limits_of(component)] == [(8, 48)],
            "8 running, 48 queued",
        )
        assert (await client.post("/run", content=b"{}")).status_code == 200
        release.set()
        await asyncio.gather(*held)
    [logged] = [r.getMessage() for r in caplog.records if "full queue" in r.getMessage()]
    head, tail = text_block("gym_concurrency: route /run").split(" [...] ")
    assert logged.startswith(head)
    assert logged.endswith(tail)


def _limits_of(component: str) -> list[Any]:
    return [s for s in registered_limits() if s.component == component]


def verify_body() -> dict[str, Any]:
    return {
        "responses_create_params": {"input": "What is 6 * 7?"},
        "response": {
            "id": "resp_1",
            "created_at": 0.0,
            "model": "m",
            "object": "response",
            "output": [
                {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": "42", "annotations": []}],
                }
            ],
            "parallel_tool_calls": False,
            "tool_choice": "auto",
            "tools": [],
        },
        "expected_answer": "42",
    }


async def test_the_resources_server_limits_verify(component: str):
    doc = example("class MathResourcesServer(")
    default = doc["MathResourcesServerConfig"].model_fields["library_verifier"].default
    assert (default.max_concurrent, default.timeout_seconds) == (32, 60)
    quick = OperationLimit(
        limit_name="library_verifier",
        operation="verify",
        executor="subprocess",
        max_concurrent=1,
        timeout_seconds=0.05,
    )
    server = doc["MathResourcesServer"](
        config=doc["MathResourcesServerConfig"](
            host="127.0.0.1",
            port=0,
            entrypoint="app.py",
            name=component,
            domain=Domain.MATH,
            library_verifier=quick,
        ),
        server_client=ServerClient(
            head_server_config=BaseServerConfig(host="127.0.0.1", port=1),
            global_config_dict=OmegaConf.create({}),
        ),
    )
    transport = httpx.ASGITransport(app=build_app(server))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        verified = await client.post("/verify", json=verify_body())
        assert verified.status_code == 200, verified.text
        assert verified.json()["reward"] == 1.0

        verifier = limit_of(component, "library_verifier")
        assert verifier.active == 0
        await verifier.acquire()  # the only verifier slot is taken: the wait times out
        try:
            masked = await client.post("/verify", json=verify_body())
        finally:
            verifier.release()
    assert masked.status_code == 200, masked.text
    row = masked.json()
    assert (row["reward"], row["mask_sample"], row["_ng_failure_class"]) == (
        0.0,
        True,
        "judge_failed",
    )
    assert row["failure_reason"] == "no library_verifier slot within 0.05 s"
    assert verifier.admission_timeouts == 1


def test_the_yaml_shown_is_valid_yaml():
    for block in blocks("yaml"):
        assert isinstance(yaml.safe_load(block), dict)
