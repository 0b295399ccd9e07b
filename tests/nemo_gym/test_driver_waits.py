"""Which `/run` replies the rollout driver waits out under the opt-in (driver_waits.py): NeMo
Gym's own admission failure and this project's refusals, as NeMo Gym's EpisodeFailure
serializes them; never a terminal failure, a failure in the episode's own work, or a result.
The waiting itself runs end to end in test_shipped.py (the tight stack)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.nemo_gym.requires import skip_module_without_nemo_gym

skip_module_without_nemo_gym()

from gym_concurrency.middleware.nemo_gym_shipped.driver_waits import (  # noqa: E402
    REFUSED_WAIT_VARIABLE,
    collecting,
    is_refusal,
)
from nemo_gym.episode_types import EpisodeFailure  # noqa: E402


def reply(**failure: Any) -> dict[str, Any]:
    dumped = EpisodeFailure(**failure).model_dump(mode="json")
    return {"episode_id": {"rollout_id": "r", "attempt": 0}, "task_id": {}, "failure": dumped}


@pytest.mark.parametrize(
    ("body", "refused"),
    [
        (reply(failure_reason="Episode admission timed out", terminal=False, stage="admission"), 1),
        (
            reply(
                failure_reason="limit model_server/upstream_requests: no slot within 0.05 s",
                terminal=False,
                stage="agent",
                failure_kind="gym_concurrency:admission_timeout",
            ),
            1,
        ),
        (reply(failure_reason="Episode admission timed out", terminal=True, stage="admission"), 0),
        (reply(failure_reason="the model said nonsense", terminal=False, stage="agent"), 0),
        ({"episode_id": {}, "task_id": {}, "result": {"reward": 1.0}}, 0),
        ("not an episode", 0),
    ],
)
def test_which_replies_are_refusals(body: Any, refused: int) -> None:
    assert is_refusal(body) is bool(refused)


def test_a_wait_that_is_not_seconds_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(REFUSED_WAIT_VARIABLE, "soon")
    with pytest.raises(ValueError, match=REFUSED_WAIT_VARIABLE), collecting():
        pass  # pragma: no cover


def test_the_wait_is_only_for_the_collection() -> None:
    from gym_concurrency.middleware.nemo_gym_shipped import driver_waits

    async def inside() -> bool:
        return driver_waits._COLLECTING.get()

    with collecting():
        assert asyncio.run(inside())  # the collection's tasks inherit it
    assert not asyncio.run(inside())
