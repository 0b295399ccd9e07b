"""The demo tests import the example app (examples/ is not installed): the repository root goes
on sys.path whichever way pytest was started."""

from __future__ import annotations

import sys
from pathlib import Path

_REPO = str(Path(__file__).resolve().parents[2])
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)
