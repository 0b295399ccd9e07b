"""The README's middleware example runs as printed; its set-up steps can be followed as written
(issue 33)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
from gym_concurrency.middleware import concurrency_middleware

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# The README's main middleware example (the order examples after it add it too).
MIDDLEWARE_EXAMPLE = "app.add_middleware(ConcurrencyLimitMiddleware, settings=settings)"


def example(marker: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    return next(block for block in blocks if marker in block)


async def test_the_middleware_example_serves_and_limits() -> None:
    namespace: dict[str, Any] = {}
    exec(example(MIDDLEWARE_EXAMPLE), namespace)
    app = namespace["app"]
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        episode = await client.post("/run")
        completion = await client.post("/v1/chat/completions")
    assert episode.status_code == 200
    assert episode.json() == {"reward": 1.0}
    assert completion.json() == {"object": "chat.completion"}


async def test_the_order_examples_answer_401_at_once_while_the_limit_is_full() -> None:
    namespace: dict[str, Any] = {}
    exec(example("dispatch=require_token)  # outside"), namespace)
    in_order = namespace["app"]
    exec(example("bypass=no_credentials"), namespace)  # the same imports and settings
    for app in (in_order, namespace["app"]):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            authenticated = {"authorization": "Bearer s3cret"}
            assert (await client.post("/run", headers=authenticated)).status_code == 200
            limit = concurrency_middleware(app).limits.routes[0].limit
            while limit.try_acquire():  # the limit is full
                pass
            try:
                # Answered by the auth at once, not after the route's 30 s queue timeout.
                refused = await client.post("/run", timeout=5)
            finally:
                for _ in range(limit.limit):
                    limit.release()
            assert refused.status_code == 401
            assert (limit.queue_depth, limit.admission_timeouts) == (0, 0)


def set_up() -> str:
    """The README's "Set up" section."""
    text = README.read_text()
    start = text.index("## Set up")
    return text[start : text.index("\n## ", start)]


def commands(block: str) -> list[str]:
    return [line.partition("#")[0].strip() for line in block.splitlines() if line.strip()]


def test_the_demo_and_the_tests_are_two_steps() -> None:
    # The demo stays in the foreground: a command after it in its block would never run.
    runs = [commands(block) for block in re.findall(r"```bash\n(.*?)```", set_up(), re.S)]
    assert ["./scripts/demo"] in runs
    assert ["./scripts/test"] in runs
    for run in runs:
        assert "./scripts/demo" not in run[:-1], run


def test_the_readme_and_scripts_test_say_the_same_duration() -> None:
    said = " ".join(set_up().split())
    figures = r"about (\d+-\d+) minutes on 2 cores on Python 3\.11 or 3\.12, and about (\d+-\d+)"
    found = re.search(figures + r" on 3\.13", said)
    assert found, said
    older, newest = found.groups()
    script = (ROOT / "scripts" / "test").read_text()
    assert f"about {older} minutes on 2 cores ({newest} on 3.13" in script
    assert f"about {newest} minutes on 2 cores" in script
    demo = " ".join((ROOT / "docs" / "demo.md").read_text().split())
    assert f"about {older} minutes on 2 cores, {newest} on Python 3.13" in demo


def test_the_quickstart_is_linked_before_the_set_up() -> None:
    assert "](docs/quickstart.md)" in README.read_text().partition("## Set up")[0]
