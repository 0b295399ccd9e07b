"""What a limit's upstream allows beside its slots (docs/rate-budgets.md, docs/engine-signals.md):
per-minute budgets of tokens and requests, and an engine's own load, with the same names on
RouteLimit, OperationLimit and ClientLimit (`UpstreamFields`, the part they share).

`budget()` and `engine.signal()` make the core's RateBudget and EngineSignal from them; every
value the core would refuse fails the settings first, naming the field.
"""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import ConfigDict, Field, field_validator, model_validator

from gym_concurrency.engines import EngineSignal
from gym_concurrency.engines.fetch import check_metrics_url
from gym_concurrency.limits.rate_budget import BUDGETS, BudgetName, BudgetShape, RateBudget

from .numbers import NumbersAreNumbers

__all__ = ["BUDGET_FIELDS", "EngineName", "EngineSignalSettings", "UpstreamFields"]

EngineName = Literal["vllm", "sglang", "trtllm-serve", "triton-trtllm"]
_PerMinute = Annotated[int, Field(ge=1)]
_Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]

BUDGET_FIELDS: dict[BudgetName, str] = {name: f"{name}_per_minute" for name in BUDGETS}
"""Each budget's setting: `tokens_per_minute`, `requests_per_minute`, ..."""


class EngineSignalSettings(NumbersAreNumbers):
    """`engine:` of a limit: admit while a self-hosted engine's /metrics says it has room
    (gym_concurrency.engines.EngineSignal, the same names and defaults)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str
    waiting_max: int = Field(ge=1)
    cache_max: float | None = Field(default=None, gt=0, le=1, allow_inf_nan=False)
    interval_seconds: _Seconds = 1.0
    stale_after_seconds: _Seconds | None = None  # None: 3 intervals
    floor: int = Field(default=1, ge=0)
    batch_size: int | None = Field(default=None, ge=1)
    engine: EngineName = "vllm"

    @field_validator("url")
    @classmethod
    def _fetchable(cls, url: str) -> str:
        try:
            return check_metrics_url(url)
        except ValueError as error:
            raise ValueError(f"{error} (the engine's Prometheus /metrics URL)") from None

    @model_validator(mode="after")
    def _stale_after_an_interval(self) -> Self:
        stale = self.stale_after_seconds
        if stale is not None and stale <= self.interval_seconds:
            raise ValueError(
                f"stale_after_seconds ({stale:g}) must be longer than interval_seconds "
                f"({self.interval_seconds:g}), or every reading goes stale before the next"
            )
        return self

    def signal(self) -> EngineSignal:
        """The EngineSignal these settings describe (it polls once the limit first asks)."""
        return EngineSignal(
            self.url,
            waiting_max=self.waiting_max,
            cache_max=self.cache_max,
            interval_seconds=self.interval_seconds,
            stale_after_seconds=self.stale_after_seconds,
            floor=self.floor,
            batch_size=self.batch_size,
            engine=self.engine,
        )


class UpstreamFields(NumbersAreNumbers):
    """The upstream settings a route, operation or client limit shares: budgets a minute,
    how they are metered, and an engine signal. Each kind adds its own `tokens` rule (the
    estimate a call reserves; None: the weight's rule)."""

    tokens_per_minute: _PerMinute | None = None
    requests_per_minute: _PerMinute | None = None
    input_tokens_per_minute: _PerMinute | None = None
    output_tokens_per_minute: _PerMinute | None = None
    # "sliding": no 60 s ever holds more than the budget; "bucket": as OpenAI and Anthropic.
    budget_shape: BudgetShape = "sliding"
    engine: EngineSignalSettings | None = None

    def budget_sizes(self) -> dict[BudgetName, int]:
        """Each configured budget's size a minute (empty: no budget)."""
        sizes = {name: getattr(self, field) for name, field in BUDGET_FIELDS.items()}
        return {name: size for name, size in sizes.items() if size is not None}

    def budget(self) -> RateBudget | None:
        """The RateBudget these settings describe, or None without a budget."""
        if not self.budget_sizes():
            return None
        return RateBudget(
            tokens_per_minute=self.tokens_per_minute,
            requests_per_minute=self.requests_per_minute,
            input_tokens_per_minute=self.input_tokens_per_minute,
            output_tokens_per_minute=self.output_tokens_per_minute,
            shape=self.budget_shape,
        )

    @property
    def has_upstream(self) -> bool:
        """Whether admission also asks a budget or an engine."""
        return self.engine is not None or bool(self.budget_sizes())

    def check_upstream(self, tokens: int | str | None) -> None:
        """ValueError if the estimate rule or the shape is set without anything to use them,
        or a fixed estimate could never fit a minute's tokens."""
        sizes = self.budget_sizes()
        if self.budget_shape != "sliding" and not sizes:
            raise ValueError(
                "budget_shape: set with no budget (tokens_per_minute, requests_per_minute, "
                "input_tokens_per_minute or output_tokens_per_minute)"
            )
        token_budgets = [
            sizes[n] for n in ("tokens", "input_tokens", "output_tokens") if n in sizes
        ]
        if tokens is not None and not token_budgets:
            raise ValueError(
                "tokens: the estimate a call reserves of a token budget, set with none "
                "(tokens_per_minute, input_tokens_per_minute or output_tokens_per_minute)"
            )
        if isinstance(tokens, int) and token_budgets and tokens > min(token_budgets):
            raise ValueError(
                f"tokens {tokens} is more than a minute's budget ({min(token_budgets)}): "
                "every call would be capped at the whole minute"
            )
