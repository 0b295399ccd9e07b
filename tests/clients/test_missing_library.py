"""A client library that is not installed is named with the extra that brings it, not only
"No module named 'aiohttp'". Run in a subprocess where the library cannot be imported."""

from __future__ import annotations

import subprocess
import sys

import pytest


def import_without(library: str, statement: str) -> str:
    # sys.modules[name] = None makes `import name` raise ModuleNotFoundError(name=name), as
    # when the library is not installed.
    code = f"import sys; sys.modules[{library!r}] = None\n{statement}"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode != 0
    return done.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("library", "statement", "needed_by", "minimum"),
    [
        (
            "aiohttp",
            "from gym_concurrency.clients import limited_middleware",
            "limited_middleware",
            "3.12",
        ),
        (
            "httpx",
            "from gym_concurrency.clients import LimitedTransport",
            "LimitedTransport",
            "0.27",
        ),
        ("aiohttp", "import gym_concurrency.clients.aiohttp", "limited_middleware", "3.12"),
        ("httpx", "import gym_concurrency.clients.engine_fetch", "httpx_fetch", "0.27"),
    ],
)
def test_a_missing_client_library_says_which_extra_brings_it(
    library: str, statement: str, needed_by: str, minimum: str
):
    last = import_without(library, statement)
    assert last == (
        f"ImportError: {needed_by} needs {library} >= {minimum}, which is not installed: "
        f"pip install 'gym-concurrency[{library}]' (or '.[{library}]' from a checkout), "
        f"or pip install '{library}>={minimum}'"
    )


def test_the_core_and_retry_policy_need_neither():
    code = (
        "import sys; sys.modules['aiohttp'] = None; sys.modules['httpx'] = None\n"
        "from gym_concurrency.clients import RetryPolicy; RetryPolicy(); print('ok')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "ok", done.stderr


def test_the_extras_the_docs_name_bring_what_they_say():
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    doc = (root / "docs" / "clients.md").read_text()
    for extra in ("httpx", "openai", "aiohttp"):
        assert f'pip install ".[{extra}]"' in doc
    assert any(r.startswith("openai") for r in extras["openai"])
    assert "gym-concurrency[httpx]" in extras["openai"]
    assert any(r.startswith("aiohttp>=3.12") for r in extras["aiohttp"])
    assert "gym-concurrency[httpx]" not in doc  # no bare name: the index cannot serve it
