"""``bergstream pipeline run`` as a process of its own, for the crash tests of this folder: started
in its own process group (a kill takes Python and the JVM), its commits counted in its log."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support import BERGSTREAM


def start_run(config: Path, topic: str, log: Path, once: bool = False) -> subprocess.Popen[bytes]:
    """``bergstream pipeline run`` (``--once`` with ``once``) in its own process group, its output
    appended to ``log``."""
    command = [BERGSTREAM, "pipeline", "run", "-c", str(config), "--topic", topic]
    with open(log, "ab") as out:
        return subprocess.Popen(
            [*command, "--once"] if once else command,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the kill takes Python and the JVM
        )


def commits_since(log: Path, offset: int) -> int:
    """The batches the run logged to ``log`` after byte ``offset`` (its commits)."""
    with open(log, "rb") as handle:
        handle.seek(offset)
        return sum(1 for line in handle if line.startswith(b"batch "))
