"""A real Spark standalone cluster on 127.0.0.1, started from the installed PySpark: one master and
workers started with ``spark-class`` (``org.apache.spark.deploy.master.Master`` and
``...worker.Worker``) as child processes, each in its own process group, stopped by PID.

The tests and ``bench/pipeline_throughput.py`` use it; the JVMs get this process's Java (the
``JAVA_HOME`` or ``java`` on ``PATH`` the pipeline's own driver uses) and this interpreter as the
executors' Python (``PYSPARK_PYTHON``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bergstream.devstack.stack.ports import free_ports

HOST = "127.0.0.1"
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


def spark_home() -> Path:
    """The installed PySpark's Spark home (its ``bin/spark-class`` and ``jars/``)."""
    from pyspark.find_spark_home import _find_spark_home

    return Path(_find_spark_home())


@dataclass(frozen=True)
class Executor:
    """An executor JVM: its PID, the worker that started it, its id in the application."""

    pid: int
    worker: str
    executor_id: str


@dataclass
class _Daemon:
    name: str
    process: subprocess.Popen[bytes]
    port: int
    ui_port: int
    log: Path


@dataclass
class StandaloneCluster:
    """A master and its workers under ``root`` (logs, work and local directories)."""

    root: Path
    worker_cores: int = 1
    worker_memory: str = "1536m"
    master: _Daemon | None = None
    workers: list[_Daemon] = field(default_factory=list)

    @property
    def url(self) -> str:
        """``spark://127.0.0.1:<port>`` of the master."""
        assert self.master is not None, "the master is not started"
        return f"spark://{HOST}:{self.master.port}"

    def _env(self, name: str) -> dict[str, str]:
        local = self.root / name / "local"
        work = self.root / name / "work"
        local.mkdir(parents=True, exist_ok=True)
        work.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update(
            {
                "SPARK_HOME": str(spark_home()),
                "SPARK_NO_DAEMONIZE": "1",
                "SPARK_LOCAL_IP": HOST,
                "SPARK_LOCAL_DIRS": str(local),
                "SPARK_WORKER_DIR": str(work),
                "SPARK_LOG_DIR": str(self.root / name),
                "PYSPARK_PYTHON": env.get("PYSPARK_PYTHON", sys.executable),
            }
        )
        return env

    def _spawn(self, name: str, arguments: list[str], port: int, ui_port: int) -> _Daemon:
        log = self.root / f"{name}.log"
        command = [str(spark_home() / "bin" / "spark-class"), *arguments]
        with open(log, "ab") as out:
            process = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self._env(name),
                cwd=self.root,
                start_new_session=True,  # its own group: executors and Python workers with it
            )
        return _Daemon(name, process, port, ui_port, log)

    def start_master(self) -> str:
        """Start the master; return its URL once its web UI answers."""
        self.root.mkdir(parents=True, exist_ok=True)
        port, ui_port = free_ports(2)
        self.master = self._spawn(
            "master",
            [
                "org.apache.spark.deploy.master.Master",
                "--host",
                HOST,
                "--port",
                str(port),
                "--webui-port",
                str(ui_port),
            ],
            port,
            ui_port,
        )
        self._wait(lambda state: state is not None, "the master to answer", self.master)
        return self.url

    def add_worker(self) -> _Daemon:
        """Start one more worker and wait until the master counts it alive."""
        assert self.master is not None, "start the master first"
        port, ui_port = free_ports(2, exclude=[self.master.port, self.master.ui_port])
        name = f"worker{len(self.workers) + 1}"
        worker = self._spawn(
            name,
            [
                "org.apache.spark.deploy.worker.Worker",
                "--host",
                HOST,
                "--port",
                str(port),
                "--webui-port",
                str(ui_port),
                "--cores",
                str(self.worker_cores),
                "--memory",
                self.worker_memory,
                "--work-dir",
                str(self.root / name / "work"),
                self.url,
            ],
            port,
            ui_port,
        )
        self.workers.append(worker)
        alive = len(self.alive_workers())
        self._wait(
            lambda state: state is not None and len(self.alive_workers(state)) > alive,
            f"{name} to register",
            worker,
        )
        return worker

    def state(self) -> dict[str, Any] | None:
        """The master's JSON status (workers, apps), or None while it does not answer."""
        assert self.master is not None
        try:
            with urllib.request.urlopen(
                f"http://{HOST}:{self.master.ui_port}/json/", timeout=5
            ) as response:
                return json.load(response)
        except OSError:
            return None

    def alive_workers(self, state: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """The workers the master counts alive."""
        state = state if state is not None else self.state()
        return [w for w in (state or {}).get("workers", []) if w.get("state") == "ALIVE"]

    def _wait(self, ready: Any, what: str, daemon: _Daemon, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not ready(self.state()):
            if daemon.process.poll() is not None:
                raise RuntimeError(f"{daemon.name} exited:\n{daemon.log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                tail = daemon.log.read_text()[-3000:]
                raise RuntimeError(f"waited {timeout}s for {what}:\n{tail}")
            time.sleep(0.3)

    def executors(self) -> list[Executor]:
        """Every executor JVM this cluster's workers run now."""
        found: list[Executor] = []
        ports = {f"Worker@{HOST}:{w.port}": w.name for w in self.workers}
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            words = [a.decode(errors="replace") for a in argv]
            if EXECUTOR_CLASS not in words or "--executor-id" not in words:
                continue
            for word in words:
                found_worker = re.search(r"Worker@[\d.]+:\d+", word)
                if found_worker and found_worker.group(0) in ports:
                    executor_id = words[words.index("--executor-id") + 1]
                    worker = ports[found_worker.group(0)]
                    found.append(Executor(int(proc.name), worker, executor_id))
        return found

    def executor_pids(self) -> dict[int, str]:
        """PID -> worker name of every executor JVM this cluster's workers run now."""
        return {executor.pid: executor.worker for executor in self.executors()}

    def stop_worker(self, worker: _Daemon) -> None:
        """Stop one worker and everything it started (its process group)."""
        _stop(worker.process)
        self.workers.remove(worker)

    def stop(self) -> None:
        """Stop the workers, then the master; every process group by its leader's PID."""
        for worker in list(self.workers):
            self.stop_worker(worker)
        if self.master is not None:
            _stop(self.master.process)
            self.master = None

    def logs(self, tail: int = 3000) -> str:
        """The last characters of every daemon's log and every executor's stderr."""
        parts = [
            f"--- {path.relative_to(self.root)}\n{path.read_text(errors='replace')[-tail:]}"
            for path in sorted(self.root.glob("*.log"))
        ]
        for path in sorted(self.root.glob("worker*/work/app-*/*/stderr")):
            text = path.read_text(errors="replace")[-tail:]
            parts.append(f"--- {path.relative_to(self.root)}\n{text}")
        return "\n".join(parts)


def _stop(process: subprocess.Popen[bytes], patience: float = 20) -> None:
    """SIGTERM the process group led by ``process`` (a JVM's shutdown hook stops its executors),
    SIGKILL what is left after ``patience`` seconds."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=patience)
    # The leader gone, its group's other members (executors, Python workers) may linger.
    deadline = time.monotonic() + patience
    while time.monotonic() < deadline:
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=patience)
