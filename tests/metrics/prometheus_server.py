"""A real Prometheus (Debian's ``prometheus`` package) for tests: started on a free 127.0.0.1
port with a config scraping the given targets every second and evaluating the given rule files,
queried through its HTTP API, stopped by PID."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from bergstream.devstack.stack.ports import free_port

PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def require(binary: str) -> str:
    """The path of a Prometheus binary; fails naming the package when it is missing (the CI's
    setup installs it)."""
    found = shutil.which(binary) or (binary if Path(binary).is_file() else None)
    assert found, f"{binary} is missing: apt-get install prometheus (scripts/setup does)"
    return found


def scaled_rules(source: Path, target: Path, seconds: int = 3) -> Path:
    """``source``'s rules with every ``for:`` cut to ``seconds`` and the thresholds and ranges of
    their expressions scaled down (``> 100000`` to ``> 5``, ``[10m]`` to ``[30s]``), so a test
    sees them fire in seconds; the expressions are otherwise the shipped ones."""
    rules = yaml.safe_load(source.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = f"{seconds}s"
            expr = re.sub(r"> (\d{3,})", "> 5", rule["expr"])
            rule["expr"] = re.sub(r"\[\d+m\]", "[30s]", expr)
    target.write_text(yaml.safe_dump(rules, sort_keys=False))
    return target


class Prometheus:
    """One Prometheus server in ``workdir`` scraping ``jobs`` (job name -> ``host:port``
    targets, path ``/metrics``) every second."""

    def __init__(self, workdir: Path, jobs: dict[str, list[str]], rule_files: list[Path]) -> None:
        self.workdir = workdir
        self.jobs = jobs
        self.rule_files = rule_files
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60) -> None:
        """Write the config, start the server and wait until it is ready."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(path) for path in self.rule_files],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": targets}]}
                for job, targets in self.jobs.items()
            ],
        }
        config_file = self.workdir / "prometheus.yml"
        config_file.write_text(yaml.safe_dump(config))
        self.port = free_port()
        log = open(self.workdir / "prometheus.log", "wb")  # noqa: SIM115 (the server keeps it)
        self.process = subprocess.Popen(
            [
                require(PROMETHEUS),
                f"--config.file={config_file}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while True:
            assert self.process.poll() is None, self.log()
            try:
                with _NO_PROXY.open(f"{self.url}/-/ready", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            assert time.monotonic() < deadline, f"Prometheus not ready:\n{self.log()}"
            time.sleep(0.3)

    def log(self) -> str:
        """The server's output."""
        path = self.workdir / "prometheus.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def api(self, path: str, **params: str) -> Any:
        """GET ``/api/v1/<path>``: its ``data`` (fails on an error answer)."""
        query = urllib.parse.urlencode(params)
        try:
            with _NO_PROXY.open(f"{self.url}/api/v1/{path}?{query}", timeout=30) as response:
                answer = json.load(response)
        except urllib.error.HTTPError as error:
            answer = json.load(error)
        assert answer.get("status") == "success", (path, params, answer)
        return answer["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's vector."""
        return list(self.api("query", query=expr)["result"])

    def firing(self) -> list[dict[str, Any]]:
        """The alerts now firing."""
        return [a for a in self.api("alerts")["alerts"] if a["state"] == "firing"]

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 20 s)."""
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None
