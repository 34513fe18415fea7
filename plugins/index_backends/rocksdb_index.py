"""The ``rocksdb`` index backend: ISK's chunk index in a RocksDB directory (``rocksdict``).

Keys are ordered so a range query is one bounded scan (all integers big-endian)::

    c | topic length (u16) | topic (UTF-8) | partition (u32) | start_offset (u64)  -> chunk
    s | topic length (u16) | topic (UTF-8) | partition (u32)                       -> max span
    h | table length (u16) | table (UTF-8) | sequence_number (u64) | snapshot_id (u64)
                                                          -> timestamp_ms (u64), state (UTF-8)
    i | table length (u16) | table (UTF-8) | snapshot_id (u64)      -> sequence_number (u64)

A chunk's value is ``end_offset, row_count, size_bytes`` (u64 each) then its bounds as JSON
(the ``sqlite`` backend's encoding). The length prefix keeps topics that are prefixes of each
other apart. The *span* is the longest ``end - start`` ever put in a partition: a chunk that
starts before a query's start can only overlap it if it starts less than a span before, so
``chunks(start, end)`` scans keys from ``start - span`` to ``end`` and nothing else. A table's
snapshot history (``h``) is one scan in sequence order; the ``i`` entries find a snapshot's
history key by its id, to replace or drop it.

Writes are one atomic ``WriteBatch`` per :meth:`RocksIndex.put_chunks`, ``put_snapshot`` and
``drop_snapshots`` (a writer lock keeps the span and id read-modify-writes whole); reads take a
snapshot, so readers in other threads always see whole batches. RocksDB admits one process per
directory (its ``LOCK`` file): a second process gets :class:`IndexLockedError`. Every iterator
and snapshot is released before a call returns, because an open iterator keeps the database (and
its lock) alive after ``close``. The write-ahead log makes every completed write survive a killed
process; ``sync_writes`` makes it survive a power failure too.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from rocksdict import AccessType, Options, Rdict, ReadOptions, WriteBatch, WriteOptions

from bergstream.core.api import ChunkEntry, SnapshotRecord
from bergstream.plugins.index_backends.call_guard import CallGuard
from bergstream.plugins.index_backends.sqlite_index import (
    IndexClosedError,
    IndexEntryError,
    check_entry,
    check_snapshot,
    decode_bounds,
    droppable_snapshot_ids,
    encode_bounds,
)

__all__ = ["IndexLockedError", "RocksIndex"]

_CHUNK = b"c"
_SPAN = b"s"
_HISTORY = b"h"
_SNAPSHOT_ID = b"i"
_FORMAT_KEY = b"\x00bergstream-index-format"
_FORMAT = b"1"
_VALUE = struct.Struct(">QQQ")
_U64 = struct.Struct(">Q")
_MAX_TOPIC = 0xFFFF
_MAX_PARTITION = 0xFFFFFFFF


class IndexLockedError(RuntimeError):
    """The RocksDB directory is open in another process (RocksDB admits one per directory)."""


def _partition_key(kind: bytes, topic: str, partition: int) -> bytes:
    name = topic.encode()
    if len(name) > _MAX_TOPIC or not 0 <= partition <= _MAX_PARTITION:
        raise IndexEntryError(f"topic {topic[:40]!r} or partition {partition} out of range")
    return kind + struct.pack(">H", len(name)) + name + struct.pack(">I", partition)


def _table_key(kind: bytes, table: str) -> bytes:
    name = table.encode()
    if len(name) > _MAX_TOPIC:
        raise IndexEntryError(
            f"snapshot table name {table[:40]!r}... is {len(name)} bytes long; at most "
            f"{_MAX_TOPIC} fit"
        )
    return kind + struct.pack(">H", len(name)) + name


def _encode(entry: ChunkEntry) -> bytes:
    check_entry(entry)
    if entry.end_offset >= 2**64 or entry.row_count >= 2**64 or entry.size_bytes >= 2**64:
        raise IndexEntryError(f"chunk {entry.topic}/{entry.partition}: a value exceeds 2**64")
    packed = _VALUE.pack(entry.end_offset, entry.row_count, entry.size_bytes)
    return packed + encode_bounds(entry.bounds).encode()


def _scan(snapshot: Any, seek: bytes, upper: bytes) -> Iterator[tuple[bytes, bytes]]:
    """(key, value) of the entries of ``snapshot`` from ``seek`` up to (not including)
    ``upper``, in key order; the iterator is released before the snapshot is."""
    options = ReadOptions()
    options.set_iterate_upper_bound(upper)
    iterator = snapshot.iter(options)
    try:
        iterator.seek(seek)
        while iterator.valid():
            yield iterator.key(), iterator.value()
            iterator.next()
    finally:
        del iterator


def _decode(topic: str, partition: int, key: bytes, value: bytes) -> ChunkEntry:
    (start,) = _U64.unpack_from(key, len(key) - _U64.size)
    end, rows, size = _VALUE.unpack_from(value)
    return ChunkEntry(
        topic=topic,
        partition=partition,
        start_offset=start,
        end_offset=end,
        row_count=rows,
        size_bytes=size,
        bounds=decode_bounds(value[_VALUE.size :].decode()),
    )


def _snapshot_get(snapshot: Any, key: bytes) -> bytes | None:
    """The value of ``key`` in ``snapshot``, None if absent (``Snapshot[key]`` raises a bare
    ``Exception`` then, which cannot be told from other errors)."""
    iterator = snapshot.iter(ReadOptions())
    try:
        iterator.seek(key)
        if iterator.valid() and iterator.key() == key:
            return iterator.value()
        return None
    finally:
        del iterator


class RocksIndex:
    """An :class:`~bergstream.core.api.IndexBackend` in one RocksDB directory."""

    def __init__(self, path: Path, sync_writes: bool = False) -> None:
        """Open (creating it if needed) the index directory ``path``; raise
        :class:`IndexLockedError` if another process has it open."""
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        try:
            self._db = Rdict(str(self.path), options, access_type=AccessType.read_write())
        except Exception as error:
            if "lock" in str(error).lower():
                raise IndexLockedError(
                    f"the rocksdb index {self.path} is open elsewhere (another process, or an "
                    "instance in this one not closed yet; RocksDB admits one per directory): "
                    "stop it, or give this gateway its own index.config.path"
                ) from error
            raise
        try:
            self._check_format(sync_writes)
        except BaseException:
            self._db.close()
            raise
        self._write_lock = threading.Lock()
        self._calls = CallGuard(IndexClosedError, str(self.path))

    def _check_format(self, sync_writes: bool) -> None:
        self._write_options = WriteOptions()
        self._write_options.sync = sync_writes
        stored = self._db.get(_FORMAT_KEY)
        if stored is None:
            self._db.put(_FORMAT_KEY, _FORMAT, self._write_options)
        elif stored != _FORMAT:
            raise IndexEntryError(
                f"the rocksdb index {self.path} has format {stored!r}, this version reads "
                f"{_FORMAT!r}: remove the directory, the gateway rebuilds it from Kafka"
            )

    def put_chunks(self, entries: Sequence[ChunkEntry]) -> None:
        """Insert or replace chunks (keyed by topic, partition, start_offset) in one batch."""
        encoded = [(entry, _encode(entry)) for entry in entries]
        if not encoded:
            return
        with self._calls.call(), self._write_lock:
            batch = WriteBatch(raw_mode=True)
            spans: dict[bytes, int] = {}
            for entry, value in encoded:
                prefix = _partition_key(_CHUNK, entry.topic, entry.partition)
                batch.put(prefix + _U64.pack(entry.start_offset), value)
                span_key = _partition_key(_SPAN, entry.topic, entry.partition)
                if span_key not in spans:
                    stored = self._db.get(span_key)
                    spans[span_key] = _U64.unpack(stored)[0] if stored else 0
                spans[span_key] = max(spans[span_key], entry.end_offset - entry.start_offset)
            for span_key, span in spans.items():
                batch.put(span_key, _U64.pack(span))
            self._db.write(batch, self._write_options)

    def chunks(
        self, topic: str, partition: int, start_offset: int = 0, end_offset: int | None = None
    ) -> list[ChunkEntry]:
        """Chunks overlapping ``[start_offset, end_offset)`` in offset order."""
        if end_offset is not None and end_offset <= start_offset:
            return []
        prefix = _partition_key(_CHUNK, topic, partition)
        with self._calls.call():
            snapshot = self._db.snapshot()
            try:
                stored_span = _snapshot_get(snapshot, _partition_key(_SPAN, topic, partition))
                if stored_span is None:
                    return []
                (span,) = _U64.unpack(stored_span)
                lower = max(0, start_offset - span + 1) if span else start_offset + 1
                if end_offset is None:
                    upper = prefix + b"\xff" * 9
                else:
                    upper = prefix + _U64.pack(min(end_offset, 2**64 - 1))
                entries = (
                    _decode(topic, partition, key, value)
                    for key, value in _scan(snapshot, prefix + _U64.pack(lower), upper)
                )
                return [entry for entry in entries if entry.end_offset > start_offset]
            finally:
                del snapshot

    def put_snapshot(self, table: str, record: SnapshotRecord) -> None:
        """Insert or replace one snapshot of ``table``'s history (keyed by table and snapshot
        id) in one batch; in the write-ahead log when this returns."""
        check_snapshot(table, record)
        history = _table_key(_HISTORY, table)
        id_key = _table_key(_SNAPSHOT_ID, table) + _U64.pack(record.snapshot_id)
        value = _U64.pack(record.timestamp_ms) + record.state.encode()
        with self._calls.call(), self._write_lock:
            batch = WriteBatch(raw_mode=True)
            stored = self._db.get(id_key)
            if stored is not None and stored != _U64.pack(record.sequence_number):
                batch.delete(history + stored + _U64.pack(record.snapshot_id))
            batch.put(
                history + _U64.pack(record.sequence_number) + _U64.pack(record.snapshot_id),
                value,
            )
            batch.put(id_key, _U64.pack(record.sequence_number))
            self._db.write(batch, self._write_options)

    def snapshots(self, table: str) -> list[SnapshotRecord]:
        """Every snapshot of ``table``'s history, by ascending sequence number (empty if none)."""
        prefix = _table_key(_HISTORY, table)
        with self._calls.call():
            snapshot = self._db.snapshot()
            try:
                upper = prefix + b"\xff" * (2 * _U64.size + 1)
                found = []
                for key, value in _scan(snapshot, prefix, upper):
                    sequence, snapshot_id = struct.unpack_from(">QQ", key, len(prefix))
                    found.append(
                        SnapshotRecord(
                            snapshot_id=snapshot_id,
                            sequence_number=sequence,
                            timestamp_ms=_U64.unpack_from(value)[0],
                            state=value[_U64.size :].decode(),
                        )
                    )
                return found
            finally:
                del snapshot

    def drop_snapshots(self, table: str, snapshot_ids: Sequence[int]) -> None:
        """Remove these snapshots from ``table``'s history in one batch (ids it does not hold
        are ignored)."""
        ids = droppable_snapshot_ids(snapshot_ids)
        if not ids:
            return
        history = _table_key(_HISTORY, table)
        id_prefix = _table_key(_SNAPSHOT_ID, table)
        with self._calls.call(), self._write_lock:
            batch = WriteBatch(raw_mode=True)
            for snapshot_id in set(ids):
                id_key = id_prefix + _U64.pack(snapshot_id)
                stored = self._db.get(id_key)
                if stored is not None:
                    batch.delete(history + stored + _U64.pack(snapshot_id))
                    batch.delete(id_key)
            self._db.write(batch, self._write_options)

    def close(self) -> None:
        """Wait for calls in progress, then flush and close the database (releasing its lock);
        later calls raise :class:`IndexClosedError`."""
        if self._calls.close():
            self._db.close()

    def __repr__(self) -> str:
        """``RocksIndex(path)``."""
        return f"RocksIndex({str(self.path)!r})"
