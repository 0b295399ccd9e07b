"""The 503 a NeMo Gym server answers for its shipped limit's refusal (the opt-in's exception
handler, middleware/nemo_gym_shipped/refusals.py), without NeMo Gym: a deadline refusal has its
own code and type and a Retry-After of 1, a queue timeout the timeout's."""

from __future__ import annotations

import json

import pytest
from gym_concurrency.middleware.nemo_gym_shipped.limits import LimitRefusedError, ShippedSemaphore
from gym_concurrency.middleware.nemo_gym_shipped.refusals import refusal_response


async def refusal(deadline: float) -> LimitRefusedError:
    judge = ShippedSemaphore(1, limit_name="judge", timeout=0.05)
    await judge.acquire()
    with pytest.raises(LimitRefusedError) as refused:
        await judge.acquire(deadline=deadline)
    judge.release()
    return refused.value


async def test_a_shipped_limits_deadline_refusal_is_answered_as_its_own() -> None:
    late = await refusal(deadline=0.01)
    assert late.reason == "deadline"
    openai = refusal_response(late, openai=True)
    assert openai.status_code == 503
    assert openai.headers["retry-after"] == "1"
    assert json.loads(openai.body)["error"]["code"] == "deadline_exceeded"
    problem = json.loads(refusal_response(late, openai=False).body)
    assert problem["type"] == "urn:gym-concurrency:deadline-exceeded"


async def test_a_shipped_limits_timeout_is_answered_as_before() -> None:
    timed_out = await refusal(deadline=30)
    assert timed_out.reason == "timeout"
    openai = refusal_response(timed_out, openai=True)
    assert json.loads(openai.body)["error"]["code"] == "admission_timeout"
    assert openai.headers["retry-after"] == "1"  # 0.05 s, rounded up
