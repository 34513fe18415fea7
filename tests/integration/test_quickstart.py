"""The README's first command, as a user runs it, on a fresh BERGSTREAM_HOME."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bergstream.core.stack.ports import free_port_block
from tests.support import REPO

pytestmark = pytest.mark.slow

BERGSTREAM = str(Path(sys.executable).parent / "bergstream")


def test_quickstart_runs_end_to_end(tmp_path):
    env = {
        **os.environ,
        "BERGSTREAM_HOME": str(tmp_path / "home"),
        "BERGSTREAM_PROXY_PORT": str(free_port_block(4)),
    }
    try:
        result = subprocess.run(
            [BERGSTREAM, "quickstart", "--records", "2000"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        out = result.stdout
        assert "produced 2000 records with keys and headers" in out
        assert "consumed all 2000 records back, identical, through the proxy" in out
        port = int(env["BERGSTREAM_PROXY_PORT"])
        assert f"brokers as clients see them: 127.0.0.1:{port + 2}" in out  # node id 1
        status = subprocess.run(
            [BERGSTREAM, "stack", "status"], env=env, capture_output=True, text=True, check=True
        ).stdout
        assert '"running": true' in status, "the stack keeps running after the quickstart"
    finally:
        subprocess.run([BERGSTREAM, "stack", "down"], env=env, capture_output=True, timeout=120)
