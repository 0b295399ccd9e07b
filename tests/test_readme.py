"""The README's middleware example runs as printed."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx

README = Path(__file__).resolve().parent.parent / "README.md"


def example(marker: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    return next(block for block in blocks if marker in block)


async def test_the_middleware_example_serves_and_limits() -> None:
    namespace: dict[str, Any] = {}
    exec(example("app.add_middleware"), namespace)
    app = namespace["app"]
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        episode = await client.post("/run")
        completion = await client.post("/v1/chat/completions")
    assert episode.status_code == 200
    assert episode.json() == {"reward": 1.0}
    assert completion.json() == {"object": "chat.completion"}
