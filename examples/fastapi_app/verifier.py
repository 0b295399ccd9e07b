"""The demo's verifier, run as a separate process the way real verifiers (sandboxes, test
suites, math checkers) are: reads one JSON object on stdin, writes one on stdout.

    in:  {"response": "...", "expected": "...", "work_seconds": 0.0}
    out: {"reward": 1.0, "matched": true}

`work_seconds` stands in for the verifier's real work (compiling, running tests).
"""

from __future__ import annotations

import json
import sys
import time


def verify(request: dict[str, object]) -> dict[str, object]:
    """Reward 1.0 when the expected answer appears in the response, else 0.0."""
    time.sleep(float(request.get("work_seconds", 0.0)))  # type: ignore[arg-type]
    matched = str(request["expected"]).strip() in str(request["response"])
    return {"reward": 1.0 if matched else 0.0, "matched": matched}


if __name__ == "__main__":
    json.dump(verify(json.load(sys.stdin)), sys.stdout)
