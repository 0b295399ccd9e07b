"""The limits NeMo Gym 0.7.0 owns, as MeteredSemaphores with the seed's names (NeMo Gym PR #5280).

A server's limit is found by what it is, not by its module (a server runs as `__main__`): a
private attribute holding a plain `asyncio.Semaphore` sized by a named config field. Each rule
below names the attribute, the field and the limit it becomes; the first rule whose attribute
and field a server has, and whose semaphore's size is the field's value, applies. The swap is
made after the server is built and before it serves, so no slot is ever held across it.

- `_semaphore` sized by `max_concurrent_requests` -> `upstream_requests` (openai_model,
  switchyard_model), or by `num_concurrent_requests` (azure_openai_model, inference_provider);
- `_library_verifier_semaphore`, `library_verifier_max_concurrency` -> `library_verifier`
  (math_with_judge);
- `_judge_endpoint_max_concurrency`, `_judge_sem` or `_judge_semaphore` sized by
  `judge_endpoint_max_concurrency` -> `judge` (equivalence_llm_judge, text_to_sql,
  terminus_judge, gdp_pdf, labbench2_vlm, xstest, rolemrc), or by `judge_concurrency` (arena);
  `_semaphore` sized by `judge_endpoint_max_concurrency` -> `judge` (agentif, longmemeval);
- `_semaphore`, `num_processes` -> `verifier_processes` (code_gen, code_fim, evalplus, ...);
- `_bash_semaphore`, `bash_max_concurrency` -> `tool_bash` (browsecomp_advanced_harness);
- `_slots`, `max_concurrent_sessions` -> `sessions` (terminal_bench_4).

The environment server's `episodes` and the rollout driver's `rollouts` are ShippedSemaphores
too, made in `patches.py` (their owners and timeouts differ). `upstream_requests` waits at most
the raw config's `upstream_pool_timeout_seconds` (the seed's field, which NeMo Gym 0.7.0's config
model drops), every other rule's limit as long as it takes, as NeMo Gym's own did.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Literal

from gym_concurrency import MeteredSemaphore
from gym_concurrency.limits import Refusal

__all__ = [
    "RULES",
    "LimitRefusedError",
    "Rule",
    "ShippedSemaphore",
    "component_of",
    "instrument_server",
]

ROLLOUTS = "rollouts"
EPISODES = "episodes"
UPSTREAM_POOL_TIMEOUT_FIELD = "upstream_pool_timeout_seconds"


class LimitRefusedError(TimeoutError):
    """A shipped limit's admission timed out (`reason` "timeout"), or the request's deadline
    ended the wait ("deadline"): a builtin TimeoutError, counted once as a timeout by the
    semaphore, that names the limit so its server can answer it as a refusal."""

    def __init__(
        self,
        message: str,
        limit_name: str,
        seconds: float | None,
        reason: Literal["timeout", "deadline"] = "timeout",
    ) -> None:
        super().__init__(message)
        self.limit_name = limit_name
        self.seconds = seconds
        self.reason = reason


class ShippedSemaphore(MeteredSemaphore):
    """A MeteredSemaphore whose admission timeout (or deadline) raises LimitRefusedError."""

    def _refused(self, refusal: Refusal, deadline: float | None = None) -> Exception:
        error = super()._refused(refusal, deadline)
        if refusal == "timeout" or refusal == "deadline":
            return LimitRefusedError(str(error), self.limit_name or "", self.timeout, refusal)
        return error


@dataclass(frozen=True, slots=True)
class Rule:
    """`attribute` sized by config `field` becomes the limit `limit_name`."""

    attribute: str
    field: str
    limit_name: str


RULES: tuple[Rule, ...] = (
    Rule("_semaphore", "max_concurrent_requests", "upstream_requests"),
    Rule("_semaphore", "num_concurrent_requests", "upstream_requests"),
    Rule("_library_verifier_semaphore", "library_verifier_max_concurrency", "library_verifier"),
    Rule("_judge_endpoint_max_concurrency", "judge_endpoint_max_concurrency", "judge"),
    Rule("_judge_sem", "judge_endpoint_max_concurrency", "judge"),
    Rule("_judge_semaphore", "judge_endpoint_max_concurrency", "judge"),
    Rule("_judge_semaphore", "judge_concurrency", "judge"),
    Rule("_semaphore", "judge_endpoint_max_concurrency", "judge"),
    Rule("_semaphore", "num_processes", "verifier_processes"),
    Rule("_bash_semaphore", "bash_max_concurrency", "tool_bash"),
    Rule("_slots", "max_concurrent_sessions", "sessions"),
)


def component_of(server: object) -> str:
    """The seed's component for a NeMo Gym server instance (by its base class)."""
    from nemo_gym.base_environment_server import BaseEnvironmentServer
    from nemo_gym.base_resources_server import SimpleResourcesServer
    from nemo_gym.base_responses_api_model import SimpleResponsesAPIModel

    if isinstance(server, SimpleResponsesAPIModel):
        return "model_server"
    if isinstance(server, SimpleResourcesServer):
        return "resources_server"
    if isinstance(server, BaseEnvironmentServer):
        return "environment_server"
    return "server"


def instrument_server(server: Any, raw_config: dict[str, Any]) -> list[ShippedSemaphore]:
    """Swap each of `server`'s plain semaphores that a rule names for a ShippedSemaphore of the
    same size; the ones made. `raw_config` is the server's own config as `gym env start` gave it."""
    made: list[ShippedSemaphore] = []
    taken: set[str] = set()
    config, name, component = server.config, server.config.name, component_of(server)
    for rule in RULES:
        semaphore = getattr(server, rule.attribute, None)
        size = getattr(config, rule.field, None)
        if rule.attribute in taken or not isinstance(size, int):
            continue
        if not isinstance(semaphore, asyncio.Semaphore) or not _plain(
            semaphore, size
        ):  # sized by something else: not this rule's limit
            continue
        timeout = raw_config.get(UPSTREAM_POOL_TIMEOUT_FIELD)
        metered = ShippedSemaphore(
            size,
            component=component,
            limit_name=rule.limit_name,
            server=name,
            timeout=float(timeout) if rule.limit_name == "upstream_requests" and timeout else None,
        )
        setattr(server, rule.attribute, metered)
        taken.add(rule.attribute)
        made.append(metered)
    return made


def _plain(semaphore: asyncio.Semaphore, size: int) -> bool:
    """NeMo Gym's own semaphore (not ours) of `size` slots, none taken and nobody waiting."""
    return (
        not isinstance(semaphore, MeteredSemaphore)
        and getattr(semaphore, "_value", None) == size
        and not getattr(semaphore, "_waiters", None)
    )
