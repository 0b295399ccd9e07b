"""NeMo Gym 0.7.0's own telemetry (nemo-lens), as the opt-in meets it.

- NeMo Gym 0.7.0 was written against a nemo-lens commit (b0f977d4) whose `nemo.lens.semconv`
  has `NV_DL_RANK` and `NV_DL_WORLD_SIZE`; nemo-lens 0.1.0, the only release, has neither, so
  `init_telemetry` fails that import, logs "nemo-lens is not installed" at DEBUG and exports
  nothing. `supply_semconv_names` adds the two names, with nemo-lens's own values, to a
  `nemo.lens.semconv` that lacks them (a name it has is never replaced).
- `gym eval run` never calls `init_telemetry`: `start_in_driver` does, as NeMo Gym's own
  orchestrator does for itself, so the driver exports with the settings its config gives
  every NeMo Gym process.
- `why_not_exporting` says why NeMo Gym's telemetry exports nothing in this process.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
from types import ModuleType

__all__ = [
    "DRIVER_NAME",
    "SEMCONV_NAMES",
    "start_in_driver",
    "supply_semconv_names",
    "why_not_exporting",
]

# The names NeMo Gym 0.7.0 imports from nemo.lens.semconv that nemo-lens 0.1.0 lacks, with
# their values in nemo-lens's own semconv (NVIDIA-NeMo/Lens, src/nemo/lens/semconv.py).
SEMCONV_NAMES = {"NV_DL_RANK": "nv.dl.rank", "NV_DL_WORLD_SIZE": "nv.dl.world_size"}
# How the rollout driver names itself to NeMo Gym's telemetry (its service.name gets
# `/rollout_driver`, as the orchestrator's gets `/orchestrator`).
DRIVER_NAME = "rollout_driver"
_LOGGER = logging.getLogger("gym_concurrency.nemo_gym")


def supply_semconv_names(module: ModuleType) -> None:
    """Add to nemo-lens's `semconv` module each of SEMCONV_NAMES it lacks, and say so."""
    missing = [name for name in SEMCONV_NAMES if not hasattr(module, name)]
    for name in missing:
        setattr(module, name, SEMCONV_NAMES[name])
    if missing:
        _LOGGER.info(
            "gym_concurrency: nemo-lens %s lacks %s, which NeMo Gym 0.7.0's telemetry imports; "
            "supplied with nemo-lens's own values (%s)",
            _lens_version(),
            ", ".join(missing),
            ", ".join(f"{name}={SEMCONV_NAMES[name]!r}" for name in missing),
        )


def start_in_driver() -> None:
    """Start NeMo Gym's telemetry in the rollout driver's process, as its config says (its
    `init_telemetry`: idempotent, a no-op unless its telemetry is enabled, never raises)."""
    from nemo_gym.telemetry.setup import init_telemetry

    init_telemetry(server_name=DRIVER_NAME, server_type=DRIVER_NAME)


def why_not_exporting() -> str:
    """Why NeMo Gym's telemetry exports no metrics in this process, in a few words."""
    from nemo_gym.telemetry.setup import is_telemetry_env_enabled, is_telemetry_metrics_enabled

    if not is_telemetry_env_enabled():
        return (
            "it is not enabled: no `telemetry: {enabled: true}` in NeMo Gym's config, "
            "nor NEMO_GYM_OTEL_ENABLED=1 or NEMO_LENS_ENABLED=1"
        )
    if not is_telemetry_metrics_enabled():
        return "its metrics are off (`telemetry.metrics_enabled: false`)"
    try:
        semconv = importlib.import_module("nemo.lens.semconv")
    except ImportError:
        return "it is enabled, but nemo-lens is not installed (pip install 'nemo-lens[sdk]')"
    missing = [name for name in SEMCONV_NAMES if not hasattr(semconv, name)]
    if missing:
        return f"nemo-lens {_lens_version()} lacks {', '.join(missing)}, which NeMo Gym imports"
    return (
        f"it is enabled and nemo-lens {_lens_version()} is installed, but its setup started no "
        "metrics exporter (NeMo Gym's nemo_gym.telemetry.setup logs why)"
    )


def _lens_version() -> str:
    try:
        return importlib.metadata.version("nemo-lens")
    except importlib.metadata.PackageNotFoundError:
        return "(version unknown)"
