"""Helpers shared by the tests (fixtures live in conftest.py)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@dataclass
class ProxyProcess:
    """A ``bergstream run`` process serving one virtual cluster."""

    process: subprocess.Popen[str]
    bootstrap: str
    config_path: Path
    stderr_lines: list[str] = field(default_factory=list)

    def stop(self, timeout: float = 20) -> int:
        """SIGTERM the process and return its exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def log(self) -> str:
        """Everything the process wrote to stderr so far."""
        return "".join(self.stderr_lines)


def pump_stderr(stream, lines: list[str], ready: threading.Event) -> None:
    for line in stream:
        lines.append(line)
        if "bergstream: ready" in line:
            ready.set()
    ready.set()


def wait_until(predicate: Callable[[], bool], timeout: float = 30, interval: float = 0.2) -> None:
    """Poll ``predicate`` until it is true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")


def require_binary(name: str) -> str:
    """Path of a binary the test needs; fail (not skip) if scripts/setup did not install it."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: run scripts/setup")
    return path
