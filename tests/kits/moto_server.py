"""moto's server (``moto[server]``): AWS S3, Glue and STS on one port, as a process of its own on
127.0.0.1, the tests' AWS (Glue catalogs) and reference S3. Any keys sign requests to it; its
state lives in memory and ends with the process."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bergstream.devstack.stack.ports import free_port

#: The keys and region the tests sign moto's requests with.
ACCESS_KEY = "moto-test-key"
SECRET_KEY = "moto-test-secret"
REGION = "us-east-1"

_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass
class MotoServer:
    """A running ``moto_server``: ``url`` serves every AWS service."""

    process: subprocess.Popen[bytes]
    url: str
    log: Path

    def stop(self) -> None:
        """End the process by its PID."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def client(self, service: str) -> Any:
        """A boto3 client of ``service`` on this server (path-style S3)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            service,
            endpoint_url=self.url,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2}),
        )


def start_moto(workdir: Path, timeout: float = 60) -> MotoServer:
    """Start ``moto_server`` on a free 127.0.0.1 port, its log in ``workdir``; wait until it
    answers."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = workdir / "moto.log"
    executable = Path(sys.executable).with_name("moto_server")
    with log.open("ab") as out:
        process = subprocess.Popen(
            [str(executable), "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=out
        )
    server = MotoServer(process, f"http://127.0.0.1:{port}", log)
    deadline = time.monotonic() + timeout
    while True:
        try:
            with _NO_PROXY.open(f"{server.url}/moto-api/data.json", timeout=2) as answer:
                if answer.status == 200:
                    return server
        except (urllib.error.URLError, OSError):
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            server.stop()
            raise RuntimeError(f"moto_server did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
