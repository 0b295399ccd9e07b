"""The demo's configuration: its own knobs (DEMO_*) and its concurrency limits (a YAML file,
overridden by GYM_CONCURRENCY_* environment variables)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from gym_concurrency.middleware import ConcurrencySettings
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_SETTINGS_FILE = Path(__file__).with_name("settings.yaml")

_Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class DemoConfig(BaseSettings):
    """Where the upstream model is and how long the demo waits for it and for the verifier."""

    model_config = SettingsConfigDict(env_prefix="DEMO_", extra="ignore")

    upstream_base_url: str = "http://127.0.0.1:8001/v1"
    upstream_api_key: str | None = None
    upstream_model: str = "fake-model"
    upstream_timeout_seconds: _Seconds = 30.0
    verifier_timeout_seconds: _Seconds = 5.0
    settings_file: Path = DEFAULT_SETTINGS_FILE
    status_refresh_seconds: _Seconds = 1.0
    # One Prometheus port per process ("9464-9471"), for several workers; None: /metrics.
    metrics_ports: str | None = None
    metrics_host: str = "127.0.0.1"


def load_concurrency_settings(path: Path) -> ConcurrencySettings:
    """The limits in the YAML file at `path`, with GYM_CONCURRENCY_* variables taking precedence
    (the library's one rule: code, then environment, then file, then defaults)."""
    if not path.is_file():
        raise FileNotFoundError(f"DEMO_SETTINGS_FILE: no settings file at {path}")
    return ConcurrencySettings.from_file(path)
