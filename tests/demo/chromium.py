"""Headless Debian Chromium driven over the DevTools protocol on a pipe (fds 3 and 4), so a
test can load a page, read its DOM again later, and take screenshots with no extra packages."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from demo_processes import require_binary

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--remote-debugging-pipe",
    "--window-size=900,700",
]


def _above_nine(fd: int) -> int:
    """A duplicate of `fd` numbered 10 or more; `fd` itself is closed."""
    high = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return high


class Chromium:
    """One headless browser with one page; `evaluate` runs JavaScript in it."""

    def __init__(self, log_dir: Path) -> None:
        binary = require_binary("chromium")
        self._profile = tempfile.TemporaryDirectory(prefix="chromium-profile-")
        to_browser_read, self._to_browser = os.pipe()
        self._from_browser, from_browser_write = os.pipe()
        # Above 9, so that moving them to 3 and 4 cannot overwrite one with the other.
        to_browser_read, from_browser_write = (
            _above_nine(to_browser_read),
            _above_nine(from_browser_write),
        )
        # Chromium reads commands on fd 3 and writes answers on fd 4.
        redirect = (
            f'exec "$@" 3<&{to_browser_read} 4>&{from_browser_write} '
            f"{to_browser_read}<&- {from_browser_write}>&-"
        )
        argv = [
            "bash",
            "-c",
            redirect,
            "chromium",
            binary,
            *FLAGS,
            f"--user-data-dir={self._profile.name}",
            "about:blank",
        ]
        with (log_dir / "chromium.log").open("wb") as log:
            self._process = subprocess.Popen(
                argv,
                pass_fds=(to_browser_read, from_browser_write),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        os.close(to_browser_read)
        os.close(from_browser_write)
        self._buffer = b""
        self._next_id = 0
        self._session: str | None = None

    def __enter__(self) -> Chromium:
        target = self._call("Target.createTarget", {"url": "about:blank"})["targetId"]
        attached = self._call("Target.attachToTarget", {"targetId": target, "flatten": True})
        self._session = attached["sessionId"]
        self._call("Page.enable")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self._session = None
            self._call("Browser.close", timeout=5)
        except (OSError, TimeoutError, AssertionError):
            pass
        finally:
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=5)
            os.close(self._to_browser)
            os.close(self._from_browser)
            self._profile.cleanup()

    def navigate(self, url: str, timeout: float = 20.0) -> None:
        """Open `url` and wait for its load event."""
        self._call("Page.navigate", {"url": url})
        self._wait_event("Page.loadEventFired", timeout)

    def evaluate(self, expression: str) -> Any:
        """The JSON value of a JavaScript expression evaluated in the page."""
        result = self._call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    def screenshot(self, path: Path) -> bytes:
        """A PNG of the page, also written to `path`."""
        data = base64.b64decode(self._call("Page.captureScreenshot", {"format": "png"})["data"])
        path.write_bytes(data)
        return data

    def _call(
        self, method: str, params: dict[str, Any] | None = None, timeout: float = 20.0
    ) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if self._session is not None:
            message["sessionId"] = self._session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        reply = self._receive(lambda m: m.get("id") == message["id"], timeout, method)
        assert "error" not in reply, f"{method}: {reply['error']}"
        result: dict[str, Any] = reply.get("result", {})
        return result

    def _wait_event(self, method: str, timeout: float) -> dict[str, Any]:
        return self._receive(lambda m: m.get("method") == method, timeout, method)

    def _receive(self, wanted: Any, timeout: float, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" in self._buffer:
                raw, self._buffer = self._buffer.split(b"\0", 1)
                message: dict[str, Any] = json.loads(raw)
                if wanted(message):
                    return message
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"chromium did not answer {what} within {timeout} s")
            readable, _, _ = select.select([self._from_browser], [], [], remaining)
            if readable:
                chunk = os.read(self._from_browser, 1 << 16)
                if not chunk:
                    raise AssertionError(f"chromium exited while waiting for {what}")
                self._buffer += chunk
