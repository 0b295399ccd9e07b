"""The verifier subprocess, run in process: every way it ends leaves no process behind."""

from __future__ import annotations

import asyncio
import os

import pytest
from demo_processes import verifier_processes

from examples.fastapi_app.verification import run_verifier
from gym_concurrency import ResourcesOperation


async def wait_for_verifier() -> None:
    for _ in range(500):
        if verifier_processes(os.getpid()):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the verifier process did not start")


async def test_a_finished_verifier_rewards_a_match():
    op = ResourcesOperation()
    result = await run_verifier(op, {"response": "it is 42", "expected": "42"}, 10)
    assert (result.outcome, result.reward, result.matched) == ("ok", 1.0, True)
    assert op.outcome is None  # the operation wrapper sets ok on exit


async def test_a_verifier_past_its_timeout_is_killed_with_outcome_timeout():
    op = ResourcesOperation()
    payload = {"response": "42", "expected": "42", "work_seconds": 30}
    result = await run_verifier(op, payload, 0.5)
    assert result.outcome == "timeout"
    assert op.outcome == "timeout"
    assert verifier_processes(os.getpid()) == []


async def test_a_cancelled_verification_kills_its_process():
    payload = {"response": "42", "expected": "42", "work_seconds": 30}
    task = asyncio.create_task(run_verifier(ResourcesOperation(), payload, 60))
    await wait_for_verifier()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert verifier_processes(os.getpid()) == []


async def test_a_verifier_that_fails_is_crashed_with_its_last_error_line():
    op = ResourcesOperation()
    result = await run_verifier(op, {"response": "42"}, 10)  # no "expected": KeyError
    assert result.outcome == "crashed"
    assert op.outcome == "crashed"
    assert result.detail is not None
    assert result.detail.startswith("verifier exited with 1: KeyError: 'expected'")
