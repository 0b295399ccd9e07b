"""docs/nemo-gym.md as printed: its stack diagram is the stack NeMo Gym builds, its
environment server serves and limits /run for NeMo Gym's collector, its YAML config loads
into that server's config, and its resources server limits verify through operation_limit."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.nemo_gym.requires import skip_module_without_nemo_gym

skip_module_without_nemo_gym()

from gym_concurrency.middleware import OperationLimit, RouteLimit  # noqa: E402
from nemo_gym.config_types import Domain  # noqa: E402
from nemo_gym.rollout_collection import _episode_record, _is_episode_response  # noqa: E402

from gym_concurrency import MeteredSemaphore  # noqa: E402
from gym_concurrency.limits import registered_limits  # noqa: E402
from tests.nemo_gym.environment import (  # noqa: E402
    Collector,
    build_app,
    episode_row,
    serve,
    server_client,
)
from tests.servers import eventually  # noqa: E402

DOC = Path(__file__).resolve().parents[2] / "docs" / "nemo-gym.md"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), re.S)


def example(marker: str) -> dict[str, Any]:
    """Run the doc's python block containing `marker` as a module (pydantic resolves a model's
    annotations in its module); the module's namespace."""
    code = next(block for block in blocks("python") if marker in block)
    module = types.ModuleType(f"nemo_gym_doc_example_{len(sys.modules)}")
    sys.modules[module.__name__] = module
    exec(compile(code, str(DOC), "exec"), module.__dict__)
    return module.__dict__


def limit_of(server_name: str, limit_name: str) -> MeteredSemaphore:
    [limit] = [
        s for s in registered_limits() if s.server == server_name and s.limit_name == limit_name
    ]
    return limit


def environment_server(doc: dict[str, Any], name: str, **config: Any) -> Any:
    return doc["MathEnvironmentServer"](
        config=doc["MathEnvironmentServerConfig"](
            host="127.0.0.1",
            port=0,
            entrypoint="app.py",
            name=name,
            cleanup_timeout_seconds=5,
            **config,
        ),
        server_client=server_client(),
    )


def math_row(task: int) -> dict[str, Any]:
    row = episode_row(task=task)
    row["task_input"] = {"prompt": "What is 6 * 7?", "expected": "42"}
    return row


def test_every_python_block_is_run_by_a_test():
    markers = ["class MathEnvironmentServer(", "class MathResourcesServer("]
    assert len(blocks("python")) == len(markers)
    for block, marker in zip(blocks("python"), markers, strict=True):
        assert marker in block


def test_the_stack_diagram_is_the_stack_run_webserver_builds(component: str):
    doc = example("class MathEnvironmentServer(")
    app = build_app(environment_server(doc, component))
    built = []
    layer: Any = app.build_middleware_stack()
    while not built or built[-1] != "APIRouter":  # each layer's .app is the next one in
        built.append(type(layer).__name__)
        layer = layer.app
    [diagram] = blocks("text")
    documented = [line.split()[0] for line in diagram.splitlines() if line.strip()]
    assert built == documented


@pytest.mark.usefixtures("nemo_gym_http_client")
async def test_the_environment_server_serves_and_limits_run(component: str):
    doc = example("class MathEnvironmentServer(")
    default = doc["MathEnvironmentServerConfig"].model_fields["episodes"].default
    assert default == RouteLimit(
        path="/run",
        limit_name="episodes",
        max_concurrent=100,
        queue_timeout_seconds=30,
        max_queue=500,
        failure="episode",
    )
    small = default.model_copy(update={"max_concurrent": 1, "queue_timeout_seconds": 0.05})
    server = environment_server(doc, component, episodes=small)
    assert server._admission is None  # NeMo Gym's own admission is off
    with serve(build_app(server)) as uvicorn_server:
        collector = Collector().point_at(uvicorn_server.port)
        [(_, admitted)] = await collector.collect([math_row(1)], within=10)
        assert _is_episode_response(admitted)
        assert admitted["result"] == {"reward": 1.0, "response": "The answer is 42"}

        slot = limit_of(component, "episodes")
        assert slot.component == "environment_server"
        await eventually(lambda: slot.active == 0, "the slot back")
        await slot.acquire()  # the only slot is taken: the next episode times out queued
        try:
            [(_, refused)] = await collector.collect([math_row(2)], within=10)
        finally:
            slot.release()
    assert _is_episode_response(refused)
    record = _episode_record(refused)
    assert record["_ng_failure_terminal"] is False
    assert record["_ng_failure_stage"] == "admission"
    assert record["_ng_failure_message"] == "Episode admission timed out"


def test_the_yaml_config_loads_into_the_server_config():
    doc = example("class MathEnvironmentServer(")
    [config_yaml] = blocks("yaml")
    server_config = yaml.safe_load(config_yaml)["math_env"]["environment_servers"]["math_env"]
    # NeMo Gym's loader adds the instance name; host and port come from its global config.
    config = doc["MathEnvironmentServerConfig"].model_validate(
        {**server_config, "name": "math_env", "host": "127.0.0.1", "port": 8000}
    )
    assert config.max_concurrent_episodes is None
    assert config.queue_timeout_seconds is None
    assert config.episodes == doc["MathEnvironmentServerConfig"].model_fields["episodes"].default


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
        server_client=server_client(),
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
