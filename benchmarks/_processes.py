"""A benchmark's child processes (servers, fake upstreams): stopped as a user stops one, with
SIGINT, so that it shuts down and flushes what it writes; killed if it has not ended in 15 s.
"""

from __future__ import annotations

import signal
import subprocess
from typing import Any

__all__ = ["stop_process"]


def stop_process(process: subprocess.Popen[Any]) -> None:
    """SIGINT `process` if it still runs and wait for it; kill it past 15 s."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
