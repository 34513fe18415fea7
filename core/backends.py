"""Interfaces that cache, index, codec and synthesizer plugins implement.

Backends are synchronous (sqlite3, rocksdict, redis-py and S3 clients are); async callers run them
in a worker thread. Each factory receives its validated config model and a :class:`ServiceContext`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from bergstream.core.config import BergstreamConfig
    from bergstream.core.plugins import PluginRegistry


@dataclass(frozen=True)
class ServiceContext:
    """What a backend or service factory gets: the whole config, the plugins, the home dir."""

    config: BergstreamConfig
    plugins: PluginRegistry
    home: Path


class CacheBackend(Protocol):
    """Stores immutable files by path. ``get`` verifies an entry before returning it."""

    def get(self, key: str) -> bytes | None:
        """The bytes stored under ``key``, or None if absent, expired or failing verification."""
        ...

    def put(self, key: str, data: bytes | memoryview) -> None:
        """Store ``data`` (any bytes-like object: ISK hands over synthesized files as views of
        the buffer they were written into, to spare a copy; call ``bytes(data)`` if a store
        needs ``bytes``) under ``key``; concurrent writers of the same key are harmless."""
        ...

    def delete(self, key: str) -> None:
        """Remove ``key`` if present."""
        ...

    def close(self) -> None:
        """Release connections and file handles."""
        ...


@dataclass(frozen=True)
class ChunkEntry:
    """One indexed chunk of a Kafka partition: offsets ``[start_offset, end_offset)``."""

    topic: str
    partition: int
    start_offset: int
    end_offset: int
    row_count: int
    size_bytes: int
    bounds: Mapping[str, tuple[Any, Any]] = field(default_factory=dict)


class IndexBackend(Protocol):
    """Maps (topic, partition, chunk) to offsets, counts, sizes and per-column bounds."""

    def put_chunks(self, entries: Sequence[ChunkEntry]) -> None:
        """Insert or replace chunks (keyed by topic, partition, start_offset)."""
        ...

    def chunks(
        self, topic: str, partition: int, start_offset: int = 0, end_offset: int | None = None
    ) -> list[ChunkEntry]:
        """Chunks overlapping ``[start_offset, end_offset)`` in offset order."""
        ...

    def close(self) -> None:
        """Flush and release the index."""
        ...


@dataclass(frozen=True)
class DecodedValue:
    """A record value split into columns; ``schema_id`` lets the codec rebuild exact bytes."""

    schema_id: int | None
    fields: Mapping[str, Any]


class ValueDecodeError(ValueError):
    """A value the codec cannot decode; callers keep such values raw, never drop them."""


class ValueCodec(Protocol):
    """Turns record values of a topic into columns and back, byte for byte."""

    def decode(self, topic: str, value: bytes) -> DecodedValue:
        """Split ``value`` into columns; raise :class:`ValueDecodeError` if it does not decode."""
        ...

    def encode(self, topic: str, value: DecodedValue) -> bytes:
        """Rebuild the exact bytes :meth:`decode` was given."""
        ...


class FileSynthesizer(Protocol):
    """Builds the bytes of one kind of file from its path alone (paths encode what they hold)."""

    def handles(self, path: str) -> bool:
        """Whether this synthesizer builds the file at ``path``."""
        ...

    async def synthesize(self, path: str) -> bytes | memoryview:
        """The complete file at ``path`` (``bytes`` or any bytes-like view)."""
        ...
