"""What the opt-in changes in NeMo Gym 0.7.0's modules, once each, as they are imported. No
source is edited: each patch replaces one name in one module or one method on one class, and
wraps NeMo Gym's own function rather than copying it.

- `nemo_gym.rollout_collection.Semaphore` -> `RolloutsSemaphore`: the driver's
  `num_samples_in_parallel` limit is `rollouts` (component `rollout_driver`).
- `RolloutCollectionHelper.run_from_config`: NeMo Gym's telemetry is started first, as its
  config says (`nemo_telemetry.start_in_driver`; `gym eval run` never starts it), and during
  the collection `ServerClient.post` waits out a `/run` reply that is a refusal rather than
  spend one of the rollout's attempts (`driver_waits.py`).
- `nemo.lens.semconv`: the two names NeMo Gym 0.7.0 imports from it and nemo-lens 0.1.0 lacks
  (`nemo_telemetry.supply_semconv_names`), so that its telemetry starts with that nemo-lens.
- `SimpleServer.setup_telemetry` (run by `run_webserver` after the server is built, before its
  app): the server's own limits become MeteredSemaphores (`limits.RULES`, and `episodes` below),
  then this process exports them (`export.ensure_export`).
- `SimpleServer.setup_exception_middleware` (run with the built app): a shipped limit's
  admission timeout is answered as a 503 refusal (`refusals.refusal_response`).
- `BaseEnvironmentServer.run_request`: `max_concurrent_episodes` is admitted by the
  MeteredSemaphore `episodes`, whose own `queue_timeout_seconds` timeout is counted as a timeout
  (NeMo Gym's `asyncio.wait_for` would count it as a cancellation), answered with NeMo Gym's
  own "Episode admission timed out" failure; the rest is NeMo Gym's `run_request`, unchanged.
- `BaseEnvironmentServer._unhandled_failure_response`: a refusal met in `run()` is NeMo Gym's
  non-terminal failure at its stage (`refusals.handled_failure`) instead of a terminal one.
- `NeMoGymAsyncOpenAI`'s engine calls and `nemo_gym.judge.call_judge`: the limits NeMo Gym
  lacks, a vllm_model's `upstream_requests` and a resources server's `judge_calls`
  (`added_limits.py`), made with the server's own in `setup_telemetry`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any

from .added_limits import add_missing_limits, patch_judge, patch_openai_utils
from .driver_waits import collecting, waiting_post
from .export import ensure_export
from .limits import EPISODES, ROLLOUTS, LimitRefusedError, ShippedSemaphore, instrument_server
from .nemo_telemetry import DRIVER_NAME, start_in_driver, supply_semconv_names
from .refusals import exception_handler, handled_failure

__all__ = ["PATCHES", "RolloutsSemaphore"]

# Each environment server's `episodes`, by id: a server lives as long as its process.
_EPISODES: dict[int, ShippedSemaphore] = {}


# The driver's limits, kept to the process's end: its last line (at exit) shows how the run
# left them, also once NeMo Gym has dropped them.
_ROLLOUTS: list[ShippedSemaphore] = []


class RolloutsSemaphore(ShippedSemaphore):
    """`Semaphore(num_samples_in_parallel)` as the rollout driver makes it: `rollouts`."""

    def __init__(self, value: int = 1) -> None:
        super().__init__(value, component="rollout_driver", limit_name=ROLLOUTS)
        _ROLLOUTS.append(self)
        start_in_driver()  # (already started by run_from_config, unless a driver skipped it)
        ensure_export(DRIVER_NAME)


def patch_rollout_collection(module: ModuleType) -> None:
    setattr(module, "Semaphore", RolloutsSemaphore)  # noqa: B010 (a module's global)
    helper_class = module.RolloutCollectionHelper
    run_from_config = helper_class.run_from_config

    @functools.wraps(run_from_config)
    async def with_telemetry(self: Any, config: Any) -> Any:
        start_in_driver()  # before NeMo Gym decides on its run-wide `gym.job` span
        with collecting():  # its `/run` posts wait out refusals (driver_waits.py)
            return await run_from_config(self, config)

    helper_class.run_from_config = with_telemetry


def patch_server_utils(module: ModuleType) -> None:
    server_class = module.SimpleServer
    setup_telemetry = server_class.setup_telemetry
    setup_exception_middleware = server_class.setup_exception_middleware

    @functools.wraps(setup_telemetry)
    def instrumented_setup_telemetry(self: Any) -> None:
        setup_telemetry(self)
        _instrument(self)
        ensure_export(self.config.name)

    @functools.wraps(setup_exception_middleware)
    def with_refusals(self: Any, app: Any) -> None:
        from .limits import component_of

        openai = component_of(self) == "model_server"
        app.add_exception_handler(LimitRefusedError, exception_handler(openai))
        setup_exception_middleware(self, app)

    server_class.setup_telemetry = instrumented_setup_telemetry
    server_class.setup_exception_middleware = with_refusals
    module.ServerClient.post = waiting_post(module.ServerClient.post)


def patch_base_environment_server(module: ModuleType) -> None:
    server_class = module.BaseEnvironmentServer
    run_request = server_class.run_request
    unhandled = server_class._unhandled_failure_response
    episode_failure_class = module.EpisodeFailure

    @functools.wraps(run_request)
    async def admitted_run_request(self: Any, request: Any) -> Any:
        episodes: ShippedSemaphore | None = _EPISODES.get(id(self))
        if episodes is None:
            return await run_request(self, request)
        try:
            await episodes.acquire()
        except TimeoutError:  # NeMo Gym's own admission-timeout answer
            failure = episode_failure_class(
                failure_reason="Episode admission timed out", terminal=False, stage="admission"
            )
            return self.failure_response(request, failure)
        try:
            return await run_request(self, request)
        finally:
            episodes.release()

    @functools.wraps(unhandled)
    def refusals_non_terminal(self: Any, request: Any, error: Exception) -> Any:
        failure = handled_failure(error)
        if failure is None:
            return unhandled(self, request, error)
        return self.failure_response(request, failure)

    server_class.run_request = admitted_run_request
    server_class._unhandled_failure_response = refusals_non_terminal


def _instrument(server: Any) -> None:
    """The server's own limits as MeteredSemaphores (see `limits.instrument_server`)."""
    from nemo_gym.base_environment_server import BaseEnvironmentServer
    from nemo_gym.global_config import get_first_server_config_dict

    try:
        config = server.server_client.global_config_dict
        raw = dict(get_first_server_config_dict(config, server.config.name))
    except Exception:  # a server built outside `gym env start`: the model's fields only
        config, raw = None, {}
    made = instrument_server(server, raw)
    add_missing_limits(server, raw, made, _judge_raw(server, config))
    if isinstance(server, BaseEnvironmentServer) and server._admission is not None:
        config = server.config
        episodes = ShippedSemaphore(
            config.max_concurrent_episodes,
            component="environment_server",
            limit_name=EPISODES,
            server=config.name,
            timeout=config.queue_timeout_seconds,
        )
        server._admission = None  # NeMo Gym's run_request then admits everything we admit
        _EPISODES[id(server)] = episodes


def _judge_raw(server: Any, global_config: Any) -> dict[str, Any]:
    """The raw config of `server`'s judge model server, if it has one ({} if not found)."""
    from nemo_gym.global_config import get_first_server_config_dict

    judge = getattr(server.config, "judge_model_server", None)
    if judge is None or global_config is None:
        return {}
    try:
        return dict(get_first_server_config_dict(global_config, judge.name))
    except Exception:  # not in this config: sized without it
        return {}


# The module each patch applies to, as it is imported (or at once if it already is).
PATCHES: dict[str, Callable[[ModuleType], None]] = {
    "nemo_gym.rollout_collection": patch_rollout_collection,
    "nemo_gym.server_utils": patch_server_utils,
    "nemo_gym.base_environment_server": patch_base_environment_server,
    "nemo.lens.semconv": supply_semconv_names,
    "nemo_gym.openai_utils": patch_openai_utils,
    "nemo_gym.judge": patch_judge,
}
