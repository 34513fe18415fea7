"""Where the local stack keeps its state, data, logs and downloads."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bergstream.core.api import bergstream_cache, bergstream_home

__all__ = ["COMPONENTS", "DEFAULT_COMPONENTS", "StackError", "StackPaths"]

#: Every component the local stack knows, in start order.
COMPONENTS: tuple[str, ...] = (
    "redis",
    "s3",
    "kdc",
    "oidc",
    "kafka",
    "schema-registry",
    "postgres",
    "connect",
    "rest-catalog",
)

#: What ``stack up`` starts when no component is named. PostgreSQL and Kafka Connect (the
#: change-data-capture pair), the Kerberos KDC, the OIDC provider (Keycloak) and Iceberg's REST
#: catalog start only when asked for.
DEFAULT_COMPONENTS: tuple[str, ...] = ("redis", "s3", "kafka", "schema-registry")


class StackError(RuntimeError):
    """The local stack cannot do what was asked; the message says why and what to do."""


@dataclass(frozen=True)
class StackPaths:
    """The directories of one local stack.

    ``home`` holds ``stack.json`` (pids, ports, versions), per-component data and ``logs/``;
    ``cache`` holds downloads shared by every home (the Kafka and Kafka Connect jars, Apicurio
    Registry).
    """

    home: Path
    cache: Path

    @classmethod
    def resolve(cls, home: Path | str | None = None, cache: Path | str | None = None) -> StackPaths:
        """Resolve the paths: ``home`` or ``$BERGSTREAM_HOME`` or ``./.bergstream``; ``cache`` or
        ``$BERGSTREAM_CACHE`` or ``~/.cache/bergstream``. Both are made absolute, not created."""
        return cls(home=bergstream_home(home), cache=bergstream_cache(cache))

    @property
    def state_file(self) -> Path:
        """``home/stack.json``: pids, ports, versions and S3 keys of this stack."""
        return self.home / "stack.json"

    @property
    def lock_file(self) -> Path:
        """A lock file serialising concurrent ``stack up`` / ``stack down`` on this home."""
        return self.home / ".stack.lock"

    @property
    def logs(self) -> Path:
        """``home/logs``: every server's stdout/stderr and Kafka's own log files."""
        return self.home / "logs"

    def component_dir(self, name: str) -> Path:
        """The working and data directory of one component (``home/kafka`` etc.)."""
        return self.home / name

    def log_file(self, name: str) -> Path:
        """Where a component's stdout and stderr go."""
        return self.logs / f"{name}.log"

    def ensure(self) -> None:
        """Create home, logs and cache directories if missing."""
        for directory in (self.home, self.logs, self.cache):
            directory.mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def cache_lock(self, name: str) -> Iterator[None]:
        """Hold ``cache/<name>.lock`` exclusively: one process at a time fills a download."""
        self.cache.mkdir(parents=True, exist_ok=True)
        with open(self.cache / f"{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
