"""Run the verifier (verifier.py) as a real subprocess, bounded by its own timeout."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from gym_concurrency import ResourcesOperation

VERIFIER_SCRIPT = Path(__file__).with_name("verifier.py")

VerifyOutcome = Literal["ok", "timeout", "crashed"]


class VerifyResult(BaseModel):
    """What the verifier decided; reward is 0 unless it finished normally."""

    outcome: VerifyOutcome
    reward: float
    matched: bool
    detail: str | None = None


async def run_verifier(
    op: ResourcesOperation, payload: dict[str, object], timeout_seconds: float
) -> VerifyResult:
    """Run one verifier process on `payload`; kill it when `timeout_seconds` pass (outcome
    timeout) or the caller is cancelled; a process that fails is `crashed`."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(VERIFIER_SCRIPT),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(timeout_seconds):
            stdout, stderr = await process.communicate(json.dumps(payload).encode())
    except TimeoutError:
        op.outcome = "timeout"
        return VerifyResult(
            outcome="timeout",
            reward=0.0,
            matched=False,
            detail=f"verifier did not finish within {timeout_seconds:g} s",
        )
    finally:
        # Timed out, cancelled (client gone, server stopping) or done: never leave it running.
        if process.returncode is None:
            process.kill()
            await asyncio.shield(process.wait())
    return _parse(op, await process.wait(), stdout, stderr)


def _parse(op: ResourcesOperation, returncode: int, stdout: bytes, stderr: bytes) -> VerifyResult:
    if returncode == 0:
        try:
            answer = json.loads(stdout)
            return VerifyResult(
                outcome="ok", reward=float(answer["reward"]), matched=bool(answer["matched"])
            )
        except (ValueError, KeyError, TypeError):
            pass
    op.outcome = "crashed"
    last_line = stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
    return VerifyResult(
        outcome="crashed",
        reward=0.0,
        matched=False,
        detail=f"verifier exited with {returncode}: {last_line[0]}"[:500],
    )
