"""The one shape of a limit (`Limit`, read as `statistics()`) and its kinds: a process's own
`MeteredSemaphore` and the `SharedLimit` every process naming it shares through Redis; what a
limit asks of its upstream besides slots (`Upstream`: a rate budget, an engine signal)."""

# As asyncio/__init__.py: each submodule's __all__ is the package's.
from . import limit, local, shared
from .flows import FlowStatistics
from .limit import *  # noqa: F403
from .local import *  # noqa: F403
from .registry import registered_limits
from .shared import *  # noqa: F403
from .upstream import Upstream, UpstreamWait

__all__ = [
    *limit.__all__,
    *local.__all__,
    *shared.__all__,
    "FlowStatistics",
    "Upstream",
    "UpstreamWait",
    "registered_limits",
]
