"""The ``sqlite`` index backend: ISK's chunk index in one SQLite file (WAL mode).

One row per chunk, keyed by (topic, partition, start_offset); per-column bounds are JSON. One row
per snapshot of a synthesized table's history, keyed by (table_name, snapshot_id). WAL
lets one writer and many readers (threads or processes) work at once; every thread gets its own
connection. The file survives restarts: reopening it serves what was committed before.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import sqlite3
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bergstream.core.api import ChunkEntry, SnapshotRecord
from bergstream.plugins.index_backends.call_guard import CallGuard

__all__ = [
    "IndexClosedError",
    "IndexEntryError",
    "SqliteIndex",
    "check_entry",
    "check_snapshot",
    "decode_bounds",
    "droppable_snapshot_ids",
    "encode_bounds",
]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS chunks (
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    start_offset INTEGER NOT NULL,
    end_offset INTEGER NOT NULL,
    row_count INTEGER NOT NULL,
    size_bytes INTEGER NOT NULL,
    bounds TEXT NOT NULL,
    PRIMARY KEY (topic, partition, start_offset)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS chunks_by_end ON chunks (topic, partition, end_offset);
CREATE TABLE IF NOT EXISTS spans (
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    span INTEGER NOT NULL,
    PRIMARY KEY (topic, partition)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS snapshots (
    table_name TEXT NOT NULL,
    snapshot_id INTEGER NOT NULL,
    sequence_number INTEGER NOT NULL,
    timestamp_ms INTEGER NOT NULL,
    state TEXT NOT NULL,
    PRIMARY KEY (table_name, snapshot_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS snapshots_by_sequence ON snapshots (table_name, sequence_number);
"""

_UPSERT = "INSERT OR REPLACE INTO chunks VALUES (?, ?, ?, ?, ?, ?, ?)"
# The longest chunk ever put in a partition bounds how far before a range an overlapping chunk
# can start, so a range query is one bounded scan of the primary key, not a scan of the
# partition (see the rocksdb backend, which does the same).
_SPAN_UPSERT = (
    "INSERT INTO spans VALUES (?, ?, ?) "
    "ON CONFLICT (topic, partition) DO UPDATE SET span = max(span, excluded.span)"
)
_SPAN_BACKFILL = (
    "INSERT INTO spans SELECT topic, partition, max(end_offset - start_offset) FROM chunks "
    "WHERE true GROUP BY topic, partition "
    "ON CONFLICT (topic, partition) DO UPDATE SET span = max(span, excluded.span)"
)
_OVERLAPPING = (
    "SELECT topic, partition, start_offset, end_offset, row_count, size_bytes, bounds "
    "FROM chunks WHERE topic = ?1 AND partition = ?2 AND start_offset >= ?3 + 1 - "
    "coalesce((SELECT span FROM spans WHERE topic = ?1 AND partition = ?2), 0) "
    "AND start_offset < ?4 AND end_offset > ?3 "
    "ORDER BY start_offset"
)
_NO_END = 2**63 - 1
_SNAPSHOT_UPSERT = "INSERT OR REPLACE INTO snapshots VALUES (?, ?, ?, ?, ?)"
_SNAPSHOTS = (
    "SELECT snapshot_id, sequence_number, timestamp_ms, state FROM snapshots "
    "WHERE table_name = ? ORDER BY sequence_number, snapshot_id"
)
_SNAPSHOT_DELETE = "DELETE FROM snapshots WHERE table_name = ? AND snapshot_id = ?"
_INT64_END = 2**63


class IndexEntryError(ValueError):
    """A chunk entry or snapshot record the index refuses (negative or inverted offsets,
    unencodable bounds, ids or sequence numbers out of range)."""


class IndexClosedError(RuntimeError):
    """The index was used after :meth:`SqliteIndex.close`."""


def _encode_value(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            raise IndexEntryError(f"bound {value!r} is a naive datetime; give it a timezone")
        return {"$ts": value.isoformat()}
    if isinstance(value, bytes):
        return {"$b64": base64.b64encode(value).decode("ascii")}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise IndexEntryError(
        f"bound {value!r} of type {type(value).__name__} cannot be stored: use int, float, str, "
        "bytes, bool, None or an aware datetime"
    )


def _decode_value(value: Any) -> Any:
    if isinstance(value, dict):
        if "$ts" in value:
            return dt.datetime.fromisoformat(value["$ts"])
        if "$b64" in value:
            return base64.b64decode(value["$b64"])
    return value


def encode_bounds(bounds: Mapping[str, tuple[Any, Any]]) -> str:
    """JSON of per-column ``(lower, upper)`` bounds; datetimes and bytes are tagged objects."""
    out = {}
    for column, pair in bounds.items():
        if len(pair) != 2:
            raise IndexEntryError(f"bounds of {column!r} must be a (lower, upper) pair: {pair!r}")
        out[str(column)] = [_encode_value(pair[0]), _encode_value(pair[1])]
    return json.dumps(out, sort_keys=True, separators=(",", ":"))


def decode_bounds(text: str) -> dict[str, tuple[Any, Any]]:
    """The inverse of :func:`encode_bounds`."""
    return {
        column: (_decode_value(low), _decode_value(high))
        for column, (low, high) in json.loads(text).items()
    }


def check_entry(entry: ChunkEntry) -> None:
    """Raise :class:`IndexEntryError` unless ``entry`` has sane offsets, counts and sizes."""
    if entry.partition < 0 or entry.start_offset < 0 or entry.end_offset < entry.start_offset:
        raise IndexEntryError(
            f"chunk {entry.topic}/{entry.partition} [{entry.start_offset}, {entry.end_offset}) "
            "needs partition >= 0 and 0 <= start_offset <= end_offset"
        )
    if entry.row_count < 0 or entry.size_bytes < 0:
        raise IndexEntryError(
            f"chunk {entry.topic}/{entry.partition}@{entry.start_offset}: row_count and "
            "size_bytes must be >= 0"
        )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_snapshot(table: str, record: SnapshotRecord) -> None:
    """Raise :class:`IndexEntryError` unless ``record`` can be kept in ``table``'s history: a
    non-empty table name, 0 < snapshot_id < 2**63, 1 <= sequence_number < 2**63,
    0 <= timestamp_ms < 2**63 and a text state."""
    if not isinstance(table, str) or not table:
        raise IndexEntryError(f"snapshot table name {table!r} must be a non-empty str")
    where = f"snapshot {record.snapshot_id!r} of table {table[:200]!r}"
    if not _is_int(record.snapshot_id) or not 0 < record.snapshot_id < _INT64_END:
        raise IndexEntryError(f"{where}: snapshot_id must be an int with 0 < snapshot_id < 2**63")
    if not _is_int(record.sequence_number) or not 1 <= record.sequence_number < _INT64_END:
        raise IndexEntryError(
            f"{where}: sequence_number {record.sequence_number!r} must be an int with "
            "1 <= sequence_number < 2**63"
        )
    if not _is_int(record.timestamp_ms) or not 0 <= record.timestamp_ms < _INT64_END:
        raise IndexEntryError(
            f"{where}: timestamp_ms {record.timestamp_ms!r} must be an int with "
            "0 <= timestamp_ms < 2**63 (milliseconds since the epoch)"
        )
    if not isinstance(record.state, str):
        raise IndexEntryError(
            f"{where}: state must be a str (the snapshot's JSON), not {type(record.state).__name__}"
        )
    try:
        record.state.encode()
        table.encode()
    except UnicodeEncodeError as error:
        raise IndexEntryError(
            f"{where}: state or table name is not valid UTF-8 text: {error}"
        ) from error


def droppable_snapshot_ids(snapshot_ids: Sequence[int]) -> list[int]:
    """The ids of ``snapshot_ids`` an index can hold (others cannot be in it: nothing to drop);
    raise :class:`IndexEntryError` for one that is not an int."""
    for snapshot_id in snapshot_ids:
        if not _is_int(snapshot_id):
            raise IndexEntryError(f"snapshot id {snapshot_id!r} to drop is not an int")
    return [i for i in snapshot_ids if 0 < i < _INT64_END]


def _row(entry: ChunkEntry) -> tuple[Any, ...]:
    check_entry(entry)
    return (
        entry.topic,
        entry.partition,
        entry.start_offset,
        entry.end_offset,
        entry.row_count,
        entry.size_bytes,
        encode_bounds(entry.bounds),
    )


class SqliteIndex:
    """An :class:`~bergstream.core.api.IndexBackend` on one SQLite file in WAL mode."""

    def __init__(self, path: Path, busy_timeout_seconds: float = 30.0) -> None:
        """Open (creating it and its directory if needed) the index at ``path``."""
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._timeout = busy_timeout_seconds
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections: list[sqlite3.Connection] = []
        self._calls = CallGuard(IndexClosedError, str(self.path))
        connection = self._connection()
        connection.execute("PRAGMA journal_mode=WAL")
        connection.executescript(_SCHEMA)
        no_spans = connection.execute("SELECT 1 FROM spans LIMIT 1").fetchone() is None
        if no_spans and connection.execute("SELECT 1 FROM chunks LIMIT 1").fetchone():
            # A file written before spans were kept: derive them once.
            connection.execute("BEGIN IMMEDIATE")
            try:
                connection.execute(_SPAN_BACKFILL)
            except BaseException:
                connection.execute("ROLLBACK")
                raise
            connection.execute("COMMIT")

    def _connection(self) -> sqlite3.Connection:
        connection = getattr(self._local, "connection", None)
        if connection is None:
            connection = sqlite3.connect(
                self.path, timeout=self._timeout, isolation_level=None, check_same_thread=False
            )
            connection.execute("PRAGMA synchronous=NORMAL")
            self._local.connection = connection
            with self._lock:
                self._connections.append(connection)
        return connection

    def put_chunks(self, entries: Sequence[ChunkEntry]) -> None:
        """Insert or replace chunks (keyed by topic, partition, start_offset) in one transaction."""
        rows = [_row(entry) for entry in entries]
        if not rows:
            return
        spans: dict[tuple[str, int], int] = {}
        for entry in entries:
            key = (entry.topic, entry.partition)
            spans[key] = max(spans.get(key, 0), entry.end_offset - entry.start_offset)
        span_rows = [(t, p, span) for (t, p), span in spans.items()]
        with self._calls.call():
            connection = self._connection()
            connection.execute("BEGIN IMMEDIATE")
            try:
                connection.executemany(_UPSERT, rows)
                connection.executemany(_SPAN_UPSERT, span_rows)
            except BaseException:
                connection.execute("ROLLBACK")
                raise
            connection.execute("COMMIT")

    def chunks(
        self, topic: str, partition: int, start_offset: int = 0, end_offset: int | None = None
    ) -> list[ChunkEntry]:
        """Chunks overlapping ``[start_offset, end_offset)`` in offset order."""
        end = _NO_END if end_offset is None else end_offset
        with self._calls.call():
            rows = self._connection().execute(_OVERLAPPING, (topic, partition, start_offset, end))
            found = rows.fetchall()
        return [
            ChunkEntry(
                topic=row[0],
                partition=row[1],
                start_offset=row[2],
                end_offset=row[3],
                row_count=row[4],
                size_bytes=row[5],
                bounds=decode_bounds(row[6]),
            )
            for row in found
        ]

    def put_snapshot(self, table: str, record: SnapshotRecord) -> None:
        """Insert or replace one snapshot of ``table``'s history (keyed by table and snapshot
        id); committed when this returns."""
        check_snapshot(table, record)
        row = (table, record.snapshot_id, record.sequence_number, record.timestamp_ms, record.state)
        # One statement outside a transaction is its own committed transaction.
        with self._calls.call():
            self._connection().execute(_SNAPSHOT_UPSERT, row)

    def snapshots(self, table: str) -> list[SnapshotRecord]:
        """Every snapshot of ``table``'s history, by ascending sequence number (empty if none)."""
        with self._calls.call():
            found = self._connection().execute(_SNAPSHOTS, (table,)).fetchall()
        return [
            SnapshotRecord(
                snapshot_id=row[0], sequence_number=row[1], timestamp_ms=row[2], state=row[3]
            )
            for row in found
        ]

    def drop_snapshots(self, table: str, snapshot_ids: Sequence[int]) -> None:
        """Remove these snapshots from ``table``'s history in one transaction (ids it does not
        hold are ignored)."""
        ids = droppable_snapshot_ids(snapshot_ids)
        if not ids:
            return
        with self._calls.call():
            connection = self._connection()
            connection.execute("BEGIN IMMEDIATE")
            try:
                connection.executemany(_SNAPSHOT_DELETE, [(table, i) for i in ids])
            except BaseException:
                connection.execute("ROLLBACK")
                raise
            connection.execute("COMMIT")

    def close(self) -> None:
        """Wait for calls in progress on any thread, then close every connection; later calls
        raise :class:`IndexClosedError` (closing twice is harmless)."""
        if not self._calls.close():
            return
        with self._lock:
            connections, self._connections = self._connections, []
        for connection in connections:
            connection.close()
