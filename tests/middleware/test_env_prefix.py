"""Environment variables whose prefix looks like a misspelt `GYM_CONCURRENCY_` (edit distance 1
or 2) are warned about when the settings are read from the environment (issue 19, item 4).
Before, `GYM_CONCURENCY_ROUTES` was silently ignored, while a typo after the prefix is an error
with "did you mean"."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest
from gym_concurrency.middleware import ConcurrencySettings
from gym_concurrency.middleware.settings.env_prefix import misspelt_prefix
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.uvicorn_process import clean_env, uvicorn

PREFIX = "GYM_CONCURRENCY_"
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ_"
SETTINGS = list(ConcurrencySettings.model_fields)


def one_edit_away(word: str) -> set[str]:
    """Every string one insertion, deletion or substitution away from `word`."""
    cuts = [(word[:i], word[i:]) for i in range(len(word) + 1)]
    deleted = {a + b[1:] for a, b in cuts if b}
    substituted = {a + c + b[1:] for a, b in cuts if b for c in LETTERS}
    inserted = {a + c + b for a, b in cuts for c in LETTERS}
    return (deleted | substituted | inserted) - {word}


def test_every_prefix_one_edit_away_is_caught_and_corrected():
    edits = sorted(one_edit_away(PREFIX))
    assert len(edits) > 800
    for edit in edits:
        name = edit + "ROUTES"
        if name.startswith(PREFIX):  # e.g. a letter inserted after the prefix: read as a setting
            continue
        assert misspelt_prefix(name, PREFIX, SETTINGS) == PREFIX + "ROUTES", name


edit = st.tuples(
    st.sampled_from(["insert", "delete", "replace"]), st.integers(0, 17), st.sampled_from(LETTERS)
)


def edited(word: str, edits: list[tuple[str, int, str]]) -> str:
    for kind, where, letter in edits:
        where = min(where, len(word))
        if kind == "insert":
            word = word[:where] + letter + word[where:]
        elif where < len(word):
            word = word[:where] + (letter if kind == "replace" else "") + word[where + 1 :]
    return word


@settings(max_examples=2000, deadline=None)
@given(st.lists(edit, min_size=1, max_size=2))
def test_every_prefix_two_edits_away_is_caught(edits: list[tuple[str, int, str]]):
    name = edited(PREFIX, edits) + "ROUTES"
    if not name.startswith(PREFIX):
        assert misspelt_prefix(name, PREFIX, SETTINGS) is not None, name


@pytest.mark.parametrize(
    "name",
    [
        "GYM_CONCURENCY_ROUTES",  # a letter left out
        "GYM_CONCURRRENCY_ROUTES",  # one too many
        "GYM_CONCURRNECY_ROUTES",  # two letters swapped
        "GYMCONCURRENCY_ROUTES",  # the first underscore left out
        "GYM-CONCURRENCY-ROUTES",  # dashes for underscores
        "gym_concurency_routes",  # any case, as the reader itself
        "GIM_CONCURENCY_ROUTES",  # two apart
    ],
)
def test_a_prefix_one_or_two_edits_away_is_caught(name: str):
    assert misspelt_prefix(name, PREFIX) == PREFIX + name[-6:].upper()


@pytest.mark.parametrize(
    "name",
    [
        "GYM_CONCURRENCY_ROUTES",  # the prefix itself: read as settings (an error if unknown)
        "PATH",
        "GYM_CURRENCY_RATE",  # three apart
        "GYM_CURRENCY",
        "NEMO_GYM_CONCURRENCY",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "GYM_CONC",
    ],
)
def test_other_variables_are_left_alone(name: str):
    assert misspelt_prefix(name, PREFIX) is None


def test_reading_the_settings_warns_naming_the_variable_and_the_prefix(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    monkeypatch.setenv("GYM_CONCURENCY_ROUTES", '[{"path": "/run"}]')
    monkeypatch.setenv("GYM_CONCURRENCY_COMPONENT", "spelt_right")
    with caplog.at_level(logging.WARNING, "gym_concurrency.middleware"):
        settings = ConcurrencySettings()
    assert settings.component == "spelt_right"
    assert settings.routes == []  # still not read: a warning, never a guess
    (warning,) = [r for r in caplog.records if "GYM_CONCURENCY_ROUTES" in r.getMessage()]
    assert warning.levelno == logging.WARNING
    assert warning.getMessage() == (
        "gym_concurrency: the environment variable GYM_CONCURENCY_ROUTES is not read: its "
        "prefix looks like a misspelling of GYM_CONCURRENCY_ (did you mean "
        "GYM_CONCURRENCY_ROUTES?)"
    )


APP = """
from fastapi import FastAPI
from gym_concurrency.middleware import ConcurrencyLimitMiddleware

app = FastAPI()


@app.post("/run")
async def run() -> dict[str, bool]:
    return {"ok": True}


app.add_middleware(ConcurrencyLimitMiddleware)  # settings from the environment
"""


def test_uvicorn_logs_the_warning_at_start(tmp_path: Path):
    (tmp_path / "typoapp.py").write_text(APP)
    env = clean_env(GYM_CONCURRNECY_ROUTES__0__PATH="/run")
    with uvicorn(tmp_path, "typoapp:app", env) as server:
        server.wait_serving("/docs")
        assert httpx.post(server.url + "/run", timeout=5).status_code == 200
        log = server.log
    assert (
        "the environment variable GYM_CONCURRNECY_ROUTES__0__PATH is not read: its prefix "
        "looks like a misspelling of GYM_CONCURRENCY_ (did you mean "
        "GYM_CONCURRENCY_ROUTES__0__PATH?)"
    ) in log
    assert log.index("GYM_CONCURRNECY_ROUTES__0__PATH") < log.index("Application startup")
