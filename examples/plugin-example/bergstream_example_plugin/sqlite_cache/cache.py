"""The ``example-sqlite`` cache backend: entries as rows of one SQLite file.

Small enough to read in a minute, and still a complete
:class:`~bergstream.core.api.CacheBackend`: every row keeps a SHA-256 of its data, checked
on every ``get`` (a corrupt row is deleted and reported as a miss); ``INSERT OR REPLACE`` in one
transaction makes concurrent writers of one key harmless; WAL mode lets several processes (two
gateways) share the file; and the file survives restarts.
``tests/sqlite_cache/test_sqlite_cache_conformance.py`` runs bergstream's conformance suite
against it.
"""

from __future__ import annotations

import hashlib
import sqlite3
import threading
from pathlib import Path

_SCHEMA = "CREATE TABLE IF NOT EXISTS entries (key TEXT PRIMARY KEY, digest BLOB, data BLOB)"


class SqliteCache:
    """A cache backend on one SQLite file; one connection per thread."""

    def __init__(self, path: Path) -> None:
        """Open (creating it if needed) the cache file ``path``."""
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        connection = self._connection()
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute(_SCHEMA)

    def _connection(self) -> sqlite3.Connection:
        connection = getattr(self._local, "connection", None)
        if connection is None:
            connection = sqlite3.connect(
                self.path, timeout=30, isolation_level=None, check_same_thread=False
            )
            self._local.connection = connection
            with self._lock:
                self._all.append(connection)
        return connection

    def get(self, key: str) -> bytes | None:
        """The verified bytes under ``key``, or None (absent, or corrupt and then deleted)."""
        row = (
            self._connection()
            .execute("SELECT digest, data FROM entries WHERE key = ?", (key,))
            .fetchone()
        )
        if row is None:
            return None
        digest, data = row
        if hashlib.sha256(data).digest() != digest:
            self.delete(key)
            return None
        return bytes(data)

    def put(self, key: str, data: bytes | memoryview) -> None:
        """Store ``data`` under ``key`` (replacing any older entry) in one transaction."""
        self._connection().execute(
            "INSERT OR REPLACE INTO entries VALUES (?, ?, ?)",
            (key, hashlib.sha256(data).digest(), data),
        )

    def delete(self, key: str) -> None:
        """Remove ``key`` if present."""
        self._connection().execute("DELETE FROM entries WHERE key = ?", (key,))

    def close(self) -> None:
        """Close every connection."""
        with self._lock:
            connections, self._all = self._all, []
        for connection in connections:
            connection.close()
