"""The limits NeMo Gym 0.7.0 lacks, added under the opt-in (its tracker: `vllm_model` has no
limit at all; `call_judge` has no concurrency or deadline argument; a rubric's fan-out of judge
calls has no shared bound).

- `upstream_requests` (component `model_server`) for `vllm_model` and the servers built on it
  (`local_vllm_model`, ...): each call to the engine (`NeMoGymAsyncOpenAI.create_chat_completion`,
  `create_completion`, `create_response`) holds a slot for its whole exchange. Sized by
  `vllm_size`; it waits at most `upstream_pool_timeout_seconds`, as openai_model's does, and its
  refusal is the model server's 503 (`refusals.py`).
- `judge_calls` (component `resources_server`) for every resources server with a
  `judge_model_server`: one limit shared by every `call_judge` of the server (a rubric's
  fan-out included), sized by `judge_size`; a call waits at most `judge_pool_timeout_seconds`
  (or what is left of the request's deadline) and is then NeMo Gym's `JudgeError`, which its
  `judge_failsafe` answers as a masked row that resume runs again.

One server per process (`gym env start` runs each as its own `python app.py`), so each limit is
the process's own, kept in `_ADDED` once the server is built.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from types import ModuleType
from typing import Any

from .limits import ShippedSemaphore, component_of

__all__ = [
    "DEFAULT_CONCURRENT_REQUESTS",
    "DEFAULT_JUDGE_TIMEOUT_SECONDS",
    "add_missing_limits",
    "judge_size",
    "patch_judge",
    "patch_openai_utils",
    "vllm_size",
]

# vLLM's largest default `max_num_seqs` for its OpenAI server (1024 on a GPU of >= 70 GiB but
# an A100; 256 elsewhere): a limit of it never holds back a request one engine would run.
DEFAULT_CONCURRENT_REQUESTS = 1024
# How long a judge call waits for a slot when the config does not say.
DEFAULT_JUDGE_TIMEOUT_SECONDS = 300.0
UPSTREAM_TIMEOUT_FIELD = "upstream_pool_timeout_seconds"
JUDGE_TIMEOUT_FIELD = "judge_pool_timeout_seconds"
JUDGE_SIZE_FIELD = "max_concurrent_judge_calls"
# The engine calls of NeMoGymAsyncOpenAI that make a generation (not models, tokenize).
ENGINE_CALLS = ("create_chat_completion", "create_completion", "create_response")

_ADDED: dict[str, ShippedSemaphore] = {}  # "upstream_requests" / "judge_calls": this process's


def vllm_size(raw: dict[str, Any], base_urls: int) -> int:
    """A vllm_model's `upstream_requests`: its raw config's `max_concurrent_requests` (the
    seed's field, which its config model drops), else the engine it starts
    (`vllm_serve_kwargs.max_num_seqs` x `data_parallel_size`, local_vllm_model), else
    DEFAULT_CONCURRENT_REQUESTS per engine (`base_url`)."""
    explicit = raw.get("max_concurrent_requests")
    if explicit:
        return _positive("max_concurrent_requests", explicit)
    serve = raw.get("vllm_serve_kwargs") or {}
    seqs = serve.get("max_num_seqs")
    if seqs:
        replicas = serve.get("data_parallel_size") or 1
        return _positive("vllm_serve_kwargs.max_num_seqs", seqs) * int(replicas)
    return DEFAULT_CONCURRENT_REQUESTS * max(1, base_urls)


def judge_size(config: Any, raw: dict[str, Any], judge_raw: dict[str, Any]) -> int:
    """A resources server's `judge_calls`: its raw config's `max_concurrent_judge_calls`, else
    its own judge field (`judge_endpoint_max_concurrency`, `judge_concurrency`), else what its
    judge model server takes (`max_concurrent_requests`, `num_concurrent_requests`, or a
    vllm_model's `vllm_size`)."""
    explicit = raw.get(JUDGE_SIZE_FIELD)
    if explicit:
        return _positive(JUDGE_SIZE_FIELD, explicit)
    for field in ("judge_endpoint_max_concurrency", "judge_concurrency"):
        own = getattr(config, field, None)
        if isinstance(own, int) and own > 0:
            return own
    for field in ("max_concurrent_requests", "num_concurrent_requests"):
        theirs = judge_raw.get(field)
        if theirs:
            return _positive(f"judge model server's {field}", theirs)
    base_urls = judge_raw.get("base_url")
    count = 1 if base_urls is None or isinstance(base_urls, str) else len(base_urls)
    return vllm_size(judge_raw, count)


def add_missing_limits(
    server: Any, raw: dict[str, Any], made: list[ShippedSemaphore], judge_raw: dict[str, Any]
) -> list[ShippedSemaphore]:
    """This process's added limits for `server` (already built; `made`: the limits its own
    semaphores became), kept for the patched calls; the ones made."""
    config, component = server.config, component_of(server)
    added: list[ShippedSemaphore] = []
    has_upstream = any(limit.limit_name == "upstream_requests" for limit in made)
    if component == "model_server" and not has_upstream and _is_vllm(server):
        timeout = raw.get(UPSTREAM_TIMEOUT_FIELD)
        added.append(
            ShippedSemaphore(
                vllm_size(raw, len(config.base_url or [])),
                component=component,
                limit_name="upstream_requests",
                server=config.name,
                timeout=float(timeout) if timeout else None,
            )
        )
    if component == "resources_server" and getattr(config, "judge_model_server", None):
        timeout = raw.get(JUDGE_TIMEOUT_FIELD, DEFAULT_JUDGE_TIMEOUT_SECONDS)
        added.append(
            ShippedSemaphore(
                judge_size(config, raw, judge_raw),
                component=component,
                limit_name="judge_calls",
                server=config.name,
                timeout=None if timeout is None else float(timeout),
            )
        )
    for limit in added:
        _ADDED[limit.limit_name or ""] = limit
    return added


def patch_openai_utils(module: ModuleType) -> None:
    """NeMoGymAsyncOpenAI's engine calls hold this process's `upstream_requests`, if it has
    one (a vllm_model's process), for calls to an endpoint that is not NeMo Gym's own."""
    client_class = module.NeMoGymAsyncOpenAI
    for name in ENGINE_CALLS:
        setattr(client_class, name, _holding_upstream(getattr(client_class, name)))


def patch_judge(module: ModuleType) -> None:
    """`nemo_gym.judge.call_judge` holds this process's `judge_calls`, if it has one; a wait
    that runs out is NeMo Gym's JudgeError. Applied as the module is imported, before any
    resources server's `from nemo_gym.judge import call_judge`."""
    call_judge = module.call_judge
    judge_error = module.JudgeError

    @functools.wraps(call_judge)
    async def limited_call_judge(*args: Any, **kwargs: Any) -> Any:
        limit = _ADDED.get("judge_calls")
        if limit is None:
            return await call_judge(*args, **kwargs)
        try:
            await limit.acquire()
        except TimeoutError as error:  # the limit's timeout, or the request's deadline
            raise judge_error(f"{type(error).__name__}: {error}") from error
        try:
            return await call_judge(*args, **kwargs)
        finally:
            limit.release()

    setattr(module, "call_judge", limited_call_judge)  # noqa: B010 (a module's global)


def _holding_upstream(
    method: Callable[..., Awaitable[Any]],
) -> Callable[..., Awaitable[Any]]:
    @functools.wraps(method)
    async def holding(self: Any, **kwargs: Any) -> Any:
        limit = _ADDED.get("upstream_requests")
        if limit is None or self.internal:
            return await method(self, **kwargs)
        async with limit:  # its timeout raises LimitRefusedError: the server's 503
            return await method(self, **kwargs)

    return holding


def _is_vllm(server: Any) -> bool:
    """A vllm_model (by what it is: it runs as `__main__`): clients to its engines in
    `_clients`, their URLs in `config.base_url`."""
    clients = getattr(server, "_clients", None)
    return isinstance(clients, list) and hasattr(server.config, "base_url")


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value
