"""Apicurio Registry (Confluent-compatible Schema Registry API) from Maven Central, on the JDK.

The ``all`` tarball of ``io.apicurio:apicurio-registry-app`` is fetched with Maven and unpacked
into ``<cache>/apicurio-registry-<version>``; the server keeps its schemas in an in-memory H2
database, so they are gone when it stops.
"""

from __future__ import annotations

import shutil
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from .maven import copy_and_unpack, install_directory
from .paths import StackError, StackPaths

__all__ = [
    "APICURIO_VERSION",
    "CCOMPAT_PATH",
    "ensure_registry",
    "probe_registry",
    "registry_command",
    "registry_dir",
    "registry_url",
]

#: The pinned Apicurio Registry release.
APICURIO_VERSION = "3.0.9"

#: Where Apicurio serves the Confluent Schema Registry API (v7), below its root URL.
CCOMPAT_PATH = "/apis/ccompat/v7"

_ARTIFACT = f"io.apicurio:apicurio-registry-app:{APICURIO_VERSION}:tar.gz:all"
_TARBALL = f"apicurio-registry-app-{APICURIO_VERSION}-all.tar.gz"
_RUNNER = f"apicurio-registry-app-{APICURIO_VERSION}-runner.jar"
_SENTINEL = ".complete"

# No direct connections through an HTTP proxy from the environment: the server is on 127.0.0.1.
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def registry_dir(paths: StackPaths) -> Path:
    """``<cache>/apicurio-registry-<version>``: the unpacked tarball (runner jar and ``lib/``)."""
    return paths.cache / f"apicurio-registry-{APICURIO_VERSION}"


def registry_ready(paths: StackPaths) -> bool:
    """True if the complete, unpacked Apicurio release is in the cache."""
    root = registry_dir(paths)
    sentinel = root / _SENTINEL
    return (
        sentinel.is_file()
        and sentinel.read_text().strip() == _ARTIFACT
        and (root / _RUNNER).is_file()
        and (root / "lib").is_dir()
    )


def ensure_registry(paths: StackPaths | None = None) -> Path:
    """Make sure Apicurio Registry is unpacked in ``registry_dir`` (downloading its tarball with
    ``mvn dependency:copy`` the first time) and return the path of its runner jar."""
    paths = paths or StackPaths.resolve()
    if not registry_ready(paths):
        with paths.cache_lock(f"apicurio-registry-{APICURIO_VERSION}"):
            if not registry_ready(paths):
                _download(paths, registry_dir(paths))
    return registry_dir(paths) / _RUNNER


def _download(paths: StackPaths, root: Path) -> None:
    work = Path(tempfile.mkdtemp(prefix=f"apicurio-registry-{APICURIO_VERSION}.", dir=paths.cache))
    try:
        unpacked = copy_and_unpack(_ARTIFACT, _TARBALL, work)
        if not (unpacked / _RUNNER).is_file():
            raise StackError(f"{_ARTIFACT} has no {_RUNNER} at its top level")
        install_directory(unpacked, root, _SENTINEL, _ARTIFACT)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def registry_command(paths: StackPaths, java: str, port: int) -> list[str]:
    """``java ... -jar <runner>`` serving Apicurio on 127.0.0.1:``port`` with in-memory storage;
    downloads the release on first use. Its console log (warnings, and Apicurio's start-up
    lines) goes to stdout, i.e. ``logs/schema-registry.log``."""
    jar = ensure_registry(paths)
    workdir = paths.component_dir("schema-registry")
    workdir.mkdir(parents=True, exist_ok=True)
    return [
        java,
        "-Xmx384m",
        "-XX:+ExitOnOutOfMemoryError",
        "-Djava.awt.headless=true",
        # Quarkus reads -D system properties only when they come before -jar.
        f"-Dquarkus.http.port={port}",
        "-Dquarkus.http.host=127.0.0.1",
        # One log line per request would fill the log; errors are still logged.
        "-Dquarkus.http.access-log.enabled=false",
        # Already off by default; pinned so no OIDC server (auth.apicur.io) is ever contacted.
        "-Dquarkus.oidc.tenant-enabled=false",
        # Temporary files in the component's directory rather than /tmp.
        f"-Dapicurio.import.work-dir={workdir}",
        f"-Dapicurio.storage.snapshot.location={workdir}",
        "-jar",
        str(jar),
    ]


def registry_url(port: int) -> str:
    """The Confluent-compatible base URL of the registry on ``port``: what a Confluent client's
    ``url`` is set to (``GET <url>/subjects`` lists the subjects)."""
    return f"http://127.0.0.1:{port}{CCOMPAT_PATH}"


def probe_registry(port: int, timeout: float = 2.0) -> bool:
    """True once ``GET <registry_url>/subjects`` answers 200."""
    try:
        with _NO_PROXY.open(f"{registry_url(port)}/subjects", timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False
