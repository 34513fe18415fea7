"""The seam between ISK's HTTP front (REST catalog, S3 gateway) and what serves tables and files.

The HTTP layer knows Iceberg REST and S3; a :class:`TableProvider` knows Kafka, the index, the
coldset and synthesis. Files are addressed by S3 keys inside the gateway's bucket; a key encodes
everything needed to rebuild the file, so any key can be served from the key alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


class NoSuchTable(LookupError):
    """The namespace or table does not exist (REST: 404 NoSuchTableException)."""


class NoSuchNamespace(LookupError):
    """The namespace does not exist (REST: 404 NoSuchNamespaceException)."""


class NoSuchFile(LookupError):
    """No file at that key (S3: 404 NoSuchKey)."""


class ProviderUnavailable(RuntimeError):
    """Kafka or the coldset cannot be reached now (REST: 503; S3: 503 SlowDown); retry later."""


class TableNotServable(RuntimeError):
    """The table exists but cannot be served as it is (REST: 500 with the reason and the fix)."""


@dataclass(frozen=True)
class LoadedTable:
    """What LoadTable returns: the metadata file's location and its JSON content."""

    metadata_location: str
    metadata: dict[str, Any]


class TableProvider(Protocol):
    """Serves the ``hotset``, ``coldset`` and ``merged`` namespaces of one ISK gateway."""

    async def list_namespaces(self) -> list[str]:
        """Names of the namespaces (single-level)."""
        ...

    async def list_tables(self, namespace: str) -> list[str]:
        """Tables in ``namespace`` (one per topic); :class:`NoSuchNamespace` if unknown."""
        ...

    async def load_table(self, namespace: str, table: str) -> LoadedTable:
        """Fresh metadata for ``namespace.table``; the same state gives the same metadata."""
        ...

    async def file_size(self, key: str) -> int:
        """Size in bytes of the file at ``key`` (HEAD, and ``Content-Length``); may build it."""
        ...

    async def read_file(self, key: str) -> bytes:
        """The whole file at ``key``."""
        ...

    async def read_range(self, key: str, start: int, end: int) -> bytes | memoryview:
        """Bytes ``[start, end)`` of the file at ``key`` (a ranged GET)."""
        ...

    async def list_keys(self, prefix: str, limit: int) -> list[tuple[str, int]]:
        """Keys under ``prefix`` with their sizes, sorted, at most ``limit`` (ListObjectsV2)."""
        ...
