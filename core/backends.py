"""Interfaces that cache, index, codec and synthesizer plugins implement.

Backends are synchronous (sqlite3, rocksdict, redis-py and S3 clients are); async callers run them
in a worker thread. Each factory receives its validated config model and a :class:`ServiceContext`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:
    from pyiceberg.types import IcebergType

    from bergstream.core.config import BergstreamConfig
    from bergstream.core.plugins import PluginRegistry
    from bergstream.core.typed.schema_registry import RegisteredSchema, SchemaReference


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


@runtime_checkable
class ConditionalCacheBackend(CacheBackend, Protocol):
    """A cache backend that can also write a key only if it is absent, atomically against every
    other writer of the same store (other processes and machines included). ISK instances that
    share such a cache keep one snapshot history per table in it, so each serves the same
    metadata for the same log state. A backend without ``put_if_absent`` still works; then each
    instance keeps its own history."""

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Store ``data`` under ``key`` if no entry is there; True if this call stored it, False
        if an entry was there already (it is left as is). Of concurrent callers on one key,
        exactly one gets True, and every ``get`` after it returns that caller's bytes whole."""
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


@dataclass(frozen=True)
class SnapshotRecord:
    """One snapshot of a synthesized table's history, as ISK recorded it: its id, its sequence
    number (the order of the history), when it was taken, and the state it describes (JSON that
    ISK writes and reads; opaque to the index)."""

    snapshot_id: int
    sequence_number: int
    timestamp_ms: int
    state: str


class IndexBackend(Protocol):
    """Maps (topic, partition, chunk) to offsets, counts, sizes and per-column bounds, and keeps
    the snapshot history of each synthesized table."""

    def put_chunks(self, entries: Sequence[ChunkEntry]) -> None:
        """Insert or replace chunks (keyed by topic, partition, start_offset)."""
        ...

    def chunks(
        self, topic: str, partition: int, start_offset: int = 0, end_offset: int | None = None
    ) -> list[ChunkEntry]:
        """Chunks overlapping ``[start_offset, end_offset)`` in offset order."""
        ...

    def put_snapshot(self, table: str, record: SnapshotRecord) -> None:
        """Insert or replace one snapshot of ``table``'s history (keyed by table and snapshot
        id); durable when this returns, like :meth:`put_chunks`."""
        ...

    def snapshots(self, table: str) -> list[SnapshotRecord]:
        """Every snapshot of ``table``'s history, by ascending sequence number (empty if none)."""
        ...

    def drop_snapshots(self, table: str, snapshot_ids: Sequence[int]) -> None:
        """Remove these snapshots from ``table``'s history (ids it does not hold are ignored)."""
        ...

    def close(self) -> None:
        """Flush and release the index. Calls may still be running on other threads (ISK stops
        while a cancelled background step finishes on its worker thread): wait for them before
        releasing what they use; calls after ``close`` raise."""
        ...


class SchemaNotExpressible(ValueError):
    """A registered schema a value codec cannot map to Iceberg columns (a recursive Avro record,
    a decimal wider than 38 digits, ...): records written with it stay raw, with this message as
    their cause."""


@dataclass
class DecodedValues:
    """What :meth:`ValueCodec.decode` made of a batch of payloads, row ``i`` from payload ``i``.

    ``values`` has the Arrow type of the codec's Iceberg type for the schema (see
    :func:`bergstream.core.typed.row_contract.arrow_type`) and is null where the payload did not
    decode.
    ``keep_bytes[i]`` says the original bytes must be kept beside the columns: the payload did not
    decode, or re-encoding the decoded value would not give the same bytes. ``errors[i]`` says why
    a payload did not decode (``None`` when it did).
    """

    values: pa.Array
    keep_bytes: np.ndarray
    errors: list[str | None]


class ValueCodec(Protocol):
    """Turns Kafka record values (or keys) written with a registered schema into typed columns and
    back, byte for byte. Payloads reach it without the Confluent framing (magic byte and schema
    id); anything after the schema id (Protobuf's message indexes) is the codec's to read.

    Codecs must be picklable: the lake pipeline ships them to Spark's Python workers.
    """

    #: The registry schema types it reads (``"AVRO"``, ``"JSON"``, ``"PROTOBUF"``); empty for a
    #: codec that keeps values raw.
    schema_types: tuple[str, ...]

    def iceberg_type(
        self, schema: RegisteredSchema, resolve: Callable[[SchemaReference], RegisteredSchema]
    ) -> IcebergType:
        """The Iceberg type of a whole value written with ``schema`` (a struct's fields become
        columns); ``resolve`` fetches referenced schemas. Field ids may be placeholders, unique
        within the type: the table layout assigns the real ones by path. Raise
        :class:`SchemaNotExpressible` if Iceberg cannot hold such values."""
        ...

    def decode(self, schema: RegisteredSchema, payloads: pa.Array) -> DecodedValues:
        """Decode ``payloads`` (``large_binary``, no nulls, framing stripped) written with
        ``schema``; never raises for a bad payload (that row fails, with its cause)."""
        ...

    def encode(self, schema: RegisteredSchema, values: pa.Array) -> pa.Array:
        """The canonical payloads (``large_binary``, framing not included) of ``values`` (the
        Arrow type :meth:`decode` gives, no null rows): for a row that decoded with
        ``keep_bytes`` false, exactly the bytes it was decoded from."""
        ...


@dataclass(frozen=True)
class Shapes:
    """The shapes a :class:`ShapeCodec` found in a batch of values: per row the schema id of its
    shape's declared schema (``-1``: none, and why in ``errors``; a null row has neither), and
    the declared schemas, in order of first appearance."""

    ids: np.ndarray
    errors: list[str | None]
    schemas: list[RegisteredSchema]


class ShapeCodec(ValueCodec, Protocol):
    """A codec for values that carry no schema id (plain JSON): it groups a batch's rows into
    shapes and declares a schema for each, which then play the part of registered schemas
    (layout versions, schema id column, re-encoding)."""

    #: False: values carry no Confluent framing.
    framed: bool

    def shapes(
        self,
        values: pa.Array,
        columns: Mapping[str, IcebergType] | None,
        subject: str,
        *,
        window: bool = False,
        telling: bool = False,
    ) -> Shapes:
        """The shapes of ``values`` (``large_binary``, nulls allowed), declared against the
        table's current columns (top-level fields by name). ``window``: a key without a column
        gets the one the whole batch makes (to fold a new batch); otherwise its declaration
        depends on the row's shape alone, so any batch of the same rows agrees. A codec may
        bound the shapes of one batch of records (rows of further shapes get an error);
        ``telling``: ``values`` are telling values gathered from batches bounded already (see
        :meth:`telling_rows`), so no bound applies."""
        ...

    def telling_rows(self, values: pa.Array, *, telling: bool = False) -> np.ndarray:
        """Indexes of rows of ``values`` whose shapes, declared alone, are what the whole batch
        declares (the rest add nothing): what a driver folds instead of the whole batch.
        ``telling``: as for :meth:`shapes` (telling values of several batches joined)."""
        ...

    def joined_kinds(self, values: pa.Array) -> Mapping[str, Any]:
        """What the columns folded from ``values`` are made of (picklable, opaque to callers):
        each top-level key's kind over ``values`` taken together."""
        ...

    def within_kinds(self, values: pa.Array, joined: Mapping[str, Any]) -> bool:
        """Whether folding ``values`` together with the values ``joined`` came from (see
        :meth:`joined_kinds`) would make the very columns those alone make: every key of
        ``values`` is in ``joined``, of a kind it holds as it is."""
        ...


def is_shape_codec(codec: object) -> bool:
    """Whether ``codec`` is a :class:`ShapeCodec` (it says its values carry no framing)."""
    return getattr(codec, "framed", True) is False


class FileSynthesizer(Protocol):
    """Builds the bytes of one kind of file from its path alone (paths encode what they hold)."""

    def handles(self, path: str) -> bool:
        """Whether this synthesizer builds the file at ``path``."""
        ...

    async def synthesize(self, path: str) -> bytes | memoryview:
        """The complete file at ``path`` (``bytes`` or any bytes-like view)."""
        ...
