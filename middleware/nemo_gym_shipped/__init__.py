"""NeMo Gym as shipped, instrumented: one opt-in, no code of the user's, no NeMo Gym source
edited (docs/nemo-gym.md, "NeMo Gym as shipped").

`gym-concurrency-nemo-gym gym env start ...` (or `... gym eval run ...`) sets
`GYM_CONCURRENCY_NEMO_GYM=1` and puts `bootstrap/` (a `sitecustomize.py`) first on
`PYTHONPATH`. Every Python process started under it, `gym` itself and every server `gym env
start` launches (they inherit the environment), then runs `install()` at startup: NeMo Gym's own
limits become MeteredSemaphores with the names of NeMo Gym PR #5280 (`rollouts`,
`upstream_requests`, `episodes`, `library_verifier`, and the resources servers' judge and tool
limits), are exported through NeMo Gym's telemetry or ours, and a refusal met inside an
environment's `run()` ends as NeMo Gym's non-terminal failure at its stage.
"""

from .activate import SUPPORTED_VERSIONS, install, installed

__all__ = ["ENABLE_VARIABLE", "SUPPORTED_VERSIONS", "install", "installed"]

ENABLE_VARIABLE = "GYM_CONCURRENCY_NEMO_GYM"
