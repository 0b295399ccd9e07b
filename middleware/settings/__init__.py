"""What to limit, how hard, and how to fail: the settings models, read from keyword arguments,
`GYM_CONCURRENCY_*` environment variables or a YAML / JSON file (`ConcurrencySettings.from_file`);
keyword arguments win over the environment, the environment over the file."""

from . import models
from .environment import EnvironmentSettingsError
from .models import *  # noqa: F403

__all__ = [*models.__all__, "EnvironmentSettingsError"]
