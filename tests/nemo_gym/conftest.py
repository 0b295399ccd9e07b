"""NeMo Gym 0.7.0 as the judge of the middleware (issue 9).

On Python >= 3.13 (NeMo Gym 0.7.0 needs 3.13) these tests never skip: scripts/test installs
NeMo Gym there (scripts/install-nemo-gym), and if `nemo_gym` cannot be imported this conftest
fails to load, so every test here fails. On Python 3.11 and 3.12 the modules that need NeMo Gym
skip themselves (tests/nemo_gym/requires.py says why); the rest (the outer-middleware
matrix, the body race) runs on every Python.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import AsyncIterator

import pytest

from tests.nemo_gym.requires import NEMO_GYM_PYTHON, NEMO_GYM_VERSION
from tests.nemo_gym.stacks import unique_component

if NEMO_GYM_PYTHON:
    # No importorskip: on 3.13 a missing or broken NeMo Gym fails the run, loudly.
    import importlib.metadata

    _INSTALL = "scripts/install-nemo-gym <venv> installs it (scripts/test does)"
    # Importing nemo_gym rewrites sys.path (nemo_gym/__init__.py, _augment_sys_path) and, by
    # logging before logging is configured, adds a StreamHandler to the root logger: the
    # rest of the test session gets both back as they were.
    _path, _handlers = list(sys.path), list(logging.getLogger().handlers)
    try:
        import nemo_gym.base_environment_server
        import nemo_gym.rollout_collection  # noqa: F401
    except ImportError as error:
        raise ImportError(
            f"tests/nemo_gym need NeMo Gym {NEMO_GYM_VERSION} on Python 3.13 and it does not "
            f"import: {error}. {_INSTALL}"
        ) from error
    finally:
        sys.path[:] = _path
        for _handler in logging.getLogger().handlers:
            if _handler not in _handlers:
                logging.getLogger().removeHandler(_handler)
    _installed = importlib.metadata.version("nemo-gym")
    if _installed != NEMO_GYM_VERSION:
        raise ImportError(
            f"tests/nemo_gym judge with NeMo Gym {NEMO_GYM_VERSION}, found {_installed}. {_INSTALL}"
        )


@pytest.fixture
def component(request: pytest.FixtureRequest) -> str:
    """A component name no other test uses, so its limits are this test's alone."""
    return unique_component(request.node.name)


@pytest.fixture
async def nemo_gym_http_client() -> AsyncIterator[None]:
    """NeMo Gym's process-wide aiohttp client (what its ServerClient, rollout collector and
    model client send with), made on this test's event loop and closed after it."""
    from nemo_gym import server_utils

    assert not server_utils.is_global_aiohttp_client_setup()
    session = server_utils.set_global_aiohttp_client(server_utils.GlobalAIOHTTPAsyncClientConfig())
    try:
        yield
    finally:
        # NeMo Gym closes it with asyncio.run at exit, which cannot run inside a loop.
        await session.close()
        server_utils._GLOBAL_AIOHTTP_CLIENT = None
