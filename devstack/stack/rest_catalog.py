"""Apache Iceberg's own REST catalog server, from Maven Central, on the JDK.

``org.apache.iceberg:iceberg-open-api`` is the runtime jar of Iceberg's ``RESTCatalogServer``
(Iceberg's REST adapter and servlet over a JDBC catalog, sqlite-jdbc and the AWS SDK inside): the
reference server Iceberg's own tests run against. It is copied with Maven into
``<cache>/iceberg-rest-catalog-<version>``. ``RESTCatalogServer`` listens on every interface,
so the stack starts it through ``LoopbackRestCatalog.java`` (compiled there with ``javac`` on
first use), which builds the same catalog, adapter and servlet on 127.0.0.1 only.

The stack's catalog keeps its tables in a SQLite file in the component's directory and its
files on the stack's S3, in the bucket :data:`WAREHOUSE_BUCKET`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from .maven import copy_artifact, install_directory
from .paths import StackError, StackPaths
from .ports import free_port

__all__ = [
    "ICEBERG_REST_VERSION",
    "WAREHOUSE_BUCKET",
    "catalog_environment",
    "ensure_rest_catalog",
    "probe_rest_catalog",
    "rest_catalog_command",
    "rest_catalog_url",
    "running_rest_catalog",
    "warehouse",
]

#: The pinned release of ``iceberg-open-api`` (1.10.0 is the newest on Maven Central).
ICEBERG_REST_VERSION = "1.10.0"
#: The bucket on the stack's S3 holding the catalog's table files.
WAREHOUSE_BUCKET = "rest-catalog"

_ARTIFACT = f"org.apache.iceberg:iceberg-open-api:{ICEBERG_REST_VERSION}"
_JAR = f"iceberg-open-api-{ICEBERG_REST_VERSION}.jar"
_SENTINEL = ".complete"
_LAUNCHER_SOURCE = Path(__file__).with_name("LoopbackRestCatalog.java")
_LAUNCHER_CLASS = "org.apache.iceberg.rest.LoopbackRestCatalog"
_INSTALL_JDK = (
    "install a JDK with javac (Debian/Ubuntu: `apt-get install -y openjdk-17-jdk-headless`)"
)

# No HTTP proxy from the environment: the server is on 127.0.0.1.
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _install_dir(paths: StackPaths) -> Path:
    return paths.cache / f"iceberg-rest-catalog-{ICEBERG_REST_VERSION}"


def _jar_ready(root: Path) -> bool:
    sentinel = root / _SENTINEL
    return (
        sentinel.is_file() and sentinel.read_text().strip() == _ARTIFACT and (root / _JAR).is_file()
    )


def ensure_rest_catalog(paths: StackPaths, java: str) -> str:
    """The classpath that runs the launcher: the ``iceberg-open-api`` jar (downloaded with
    ``mvn dependency:copy`` the first time) and the compiled launcher (compiled with the
    ``javac`` beside ``java`` whenever its source changed)."""
    root = _install_dir(paths)
    if not _jar_ready(root):
        with paths.cache_lock(f"iceberg-rest-catalog-{ICEBERG_REST_VERSION}"):
            if not _jar_ready(root):
                work = Path(tempfile.mkdtemp(prefix="iceberg-rest-catalog.", dir=paths.cache))
                try:
                    copy_artifact(_ARTIFACT, work)
                    if not (work / _JAR).is_file():
                        raise StackError(f"Maven copied no {_JAR} for {_ARTIFACT}")
                    install_directory(work, root, _SENTINEL, _ARTIFACT)
                finally:
                    shutil.rmtree(work, ignore_errors=True)
    source = _LAUNCHER_SOURCE.read_bytes()
    classes = root / f"launcher-{hashlib.sha256(source).hexdigest()[:16]}"
    if not (classes / _SENTINEL).is_file():
        with paths.cache_lock(f"iceberg-rest-catalog-{ICEBERG_REST_VERSION}"):
            if not (classes / _SENTINEL).is_file():
                _compile_launcher(java, root / _JAR, classes)
    return f"{root / _JAR}:{classes}"


def _compile_launcher(java: str, jar: Path, classes: Path) -> None:
    javac = Path(java).with_name("javac")
    if not javac.is_file():
        raise StackError(
            f"Iceberg's REST catalog server needs `javac` beside {java} to compile "
            f"{_LAUNCHER_SOURCE.name}: {_INSTALL_JDK}"
        )
    shutil.rmtree(classes, ignore_errors=True)
    classes.mkdir(parents=True)
    out = subprocess.run(
        [str(javac), "-d", str(classes), "-cp", str(jar), str(_LAUNCHER_SOURCE)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if out.returncode != 0:
        shutil.rmtree(classes, ignore_errors=True)
        raise StackError(
            f"javac could not compile {_LAUNCHER_SOURCE} against {jar.name}:\n"
            f"{(out.stdout + out.stderr).strip()[-2000:]}"
        )
    (classes / _SENTINEL).write_text(_ARTIFACT + "\n")


def warehouse() -> str:
    """Where the stack's catalog keeps table files: ``s3://rest-catalog/warehouse``."""
    return f"s3://{WAREHOUSE_BUCKET}/warehouse"


def catalog_environment(
    paths: StackPaths, s3_endpoint: str, access_key: str, secret_key: str, region: str
) -> dict[str, str]:
    """The ``CATALOG_*`` variables the server reads its catalog properties from (``__`` is
    ``-``, ``_`` is ``.``): a JDBC catalog on SQLite in the component directory, S3FileIO on
    the stack's S3."""
    database = paths.component_dir("rest-catalog") / "catalog.db"
    return {
        "CATALOG_URI": f"jdbc:sqlite:{database}",
        "CATALOG_WAREHOUSE": warehouse(),
        "CATALOG_IO__IMPL": "org.apache.iceberg.aws.s3.S3FileIO",
        "CATALOG_S3_ENDPOINT": s3_endpoint,
        "CATALOG_S3_PATH__STYLE__ACCESS": "true",
        "CATALOG_S3_ACCESS__KEY__ID": access_key,
        "CATALOG_S3_SECRET__ACCESS__KEY": secret_key,
        "CATALOG_CLIENT_REGION": region,
    }


def rest_catalog_command(classpath: str, java: str, port: int) -> list[str]:
    """``java ... LoopbackRestCatalog 127.0.0.1 <port>``; its log (Iceberg's and Jetty's)
    goes to ``logs/rest-catalog.log``."""
    return [
        java,
        "-Xmx256m",
        "-XX:+ExitOnOutOfMemoryError",
        "-Djava.awt.headless=true",
        "-cp",
        classpath,
        _LAUNCHER_CLASS,
        "127.0.0.1",
        str(port),
    ]


def rest_catalog_url(port: int) -> str:
    """The catalog's base URL (``GET <url>/v1/config``)."""
    return f"http://127.0.0.1:{port}"


def probe_rest_catalog(port: int, timeout: float = 2.0) -> bool:
    """True once ``GET /v1/config`` answers 200."""
    try:
        with _NO_PROXY.open(f"{rest_catalog_url(port)}/v1/config", timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


@contextmanager
def running_rest_catalog(
    java: str, properties: Mapping[str, str], workdir: Path, ready_timeout: float = 90.0
) -> Iterator[str]:
    """Iceberg's REST catalog server as a child process outside any stack (benches), with the
    catalog ``properties`` (``uri``, ``warehouse``, ``catalog.name``...), its log in
    ``workdir/rest-catalog.log``; yields its URL and stops it at the end."""
    paths = StackPaths.resolve()
    classpath = ensure_rest_catalog(paths, java)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CATALOG_")}
    for name, value in properties.items():
        env["CATALOG_" + name.replace("-", "__").replace(".", "_").upper()] = value
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "rest-catalog.log"
    with log.open("ab") as out:
        process = subprocess.Popen(
            rest_catalog_command(classpath, java, port), stdout=out, stderr=out, env=env
        )
    try:
        deadline = time.monotonic() + ready_timeout
        while not probe_rest_catalog(port):
            if process.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-3000:]
                raise StackError(f"Iceberg's REST catalog server did not start:\n{tail}")
            time.sleep(0.2)
        yield rest_catalog_url(port)
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
