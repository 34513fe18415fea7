"""Pruned reads of the coldset: one :class:`ColdTable` per topic, all sharing a
:class:`~bergstream.plugins.ksi_fetch_filter.store.ColdStore` (catalog, reader threads, caches).

A read never scans a table. The current snapshot's manifests are planned once for the whole
table, on its first read: each data file belongs to the Kafka partitions its partition record
(an identity ``kafka_partition`` field) or else its ``kafka_partition`` bounds say it can hold
(a file spanning several partitions belongs to each). A fetch then picks the files whose offset
bounds reach the fetch offset, opens their Parquet footers and reads only the row groups whose
offset statistics overlap. A row group is read once for every partition of a Fetch it holds,
split into per-partition slices and cached within a memory bound; a sequential consumer gets the
next row groups loaded ahead of it. A typed table (values or keys
as columns) has a payload encoder per snapshot that rebuilds the original bytes as row groups
are decoded.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left, bisect_right
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from pyiceberg.conversions import from_bytes
from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import IntegerType, LongType, TimestamptzType

from bergstream.core.api import OFFSET_ID, PARTITION_ID, TIMESTAMP_ID, table_boundary
from bergstream.plugins.ksi_fetch_filter.segments import (
    PayloadEncoder,
    Segment,
    SegmentRef,
    concat_segments,
    merge_segments,
)

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile
    from pyiceberg.partitioning import PartitionSpec
    from pyiceberg.table import Table

    from bergstream.plugins.ksi_fetch_filter.store import ColdStore

_MAX_OFFSET = 2**63 - 1
#: After a failed table load, fail fast for this long before asking the catalog again.
_RETRY_SECONDS = 1.0


class ColdsetError(Exception):
    """The coldset could not be read (catalog, metadata or data files): a retriable failure."""


@dataclass(frozen=True, slots=True)
class FileRef:
    """A data file of one Kafka partition with the bounds its manifest entry promises."""

    path: str
    low: int
    high: int
    timestamp_high: int | None  # ms


@dataclass(frozen=True, slots=True)
class ColdRead:
    """Rows ``start:stop`` of ``segment`` are every cold row from the fetch offset on up to the
    last offset they hold; ``tail`` is the boundary minus one when those rows end the
    partition's cold rows (a batch may then claim the gap up to it), else None."""

    segment: Segment
    start: int
    stop: int
    tail: int | None
    #: The cached slices the rows come from, with the last offset of each.
    slices: tuple[tuple[tuple[str, int, int, int], int], ...] = ()


@dataclass
class _Snapshot:
    snapshot_id: int | None
    boundary: dict[int, int]
    table: Table | None
    loaded_at: float
    #: Kafka partition -> its data files in (low, high) order; None until planned.
    files: dict[int, list[FileRef]] | None = None
    #: Data file path -> the Kafka partitions it may hold (planned with ``files``).
    holders: dict[str, frozenset[int]] = field(default_factory=dict)
    #: Partitions that cannot be read (a file of theirs has delete files) -> why.
    broken: dict[int, str] = field(default_factory=dict)
    planning: threading.Lock = field(default_factory=threading.Lock)
    encoder: PayloadEncoder | None = None
    #: What the encoder was made from: the schema id and the table's properties.
    shape: tuple[int, tuple[tuple[str, str], ...]] | None = None


def _shape(table: Table) -> tuple[int, tuple[tuple[str, str], ...]]:
    return table.metadata.current_schema_id, tuple(sorted(table.properties.items()))


def _bound(bounds: dict[int, bytes] | None, field_id: int, kind: Any) -> int | None:
    if not bounds or field_id not in bounds:
        return None
    return int(from_bytes(kind, bounds[field_id]))


def _partition_position(spec: PartitionSpec) -> int | None:
    """Where an identity ``kafka_partition`` field sits in ``spec``'s partition records."""
    for position, spec_field in enumerate(spec.fields):
        if spec_field.source_id == PARTITION_ID and isinstance(
            spec_field.transform, IdentityTransform
        ):
            return position
    return None


def _held_partitions(data: DataFile, position: int | None, partitions: list[int]) -> list[int]:
    """The Kafka partitions ``data`` may hold: its identity partition value, else those of
    ``partitions`` (sorted) within its ``kafka_partition`` bounds (all without bounds)."""
    if position is not None:
        value = data.partition[position]
        if value is not None:
            return [int(value)]
    low = _bound(data.lower_bounds, PARTITION_ID, IntegerType())
    high = _bound(data.upper_bounds, PARTITION_ID, IntegerType())
    first = 0 if low is None else bisect_left(partitions, low)
    last = len(partitions) if high is None else bisect_right(partitions, high)
    return partitions[first:last]


def _file_ref(data: DataFile) -> FileRef:
    low = _bound(data.lower_bounds, OFFSET_ID, LongType())
    high = _bound(data.upper_bounds, OFFSET_ID, LongType())
    ts_high = _bound(data.upper_bounds, TIMESTAMP_ID, TimestamptzType())
    return FileRef(
        data.file_path,
        0 if low is None else low,
        _MAX_OFFSET if high is None else high,
        None if ts_high is None else ts_high // 1000,
    )


class ColdTable:
    """The coldset table of one topic, reloaded every ``table_refresh_seconds``."""

    def __init__(self, store: ColdStore, topic: str, identifier: tuple[str, str]) -> None:
        self.store = store
        self.topic = topic
        self.identifier = identifier
        self._snapshot: _Snapshot | None = None
        self._failure: tuple[float, str] | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ snapshot

    def _current(self) -> _Snapshot:
        with self._lock:
            snap = self._snapshot
            now = time.monotonic()
            if snap is not None and now - snap.loaded_at < self.store.config.table_refresh_seconds:
                return snap
            if self._failure is not None and now - self._failure[0] < _RETRY_SECONDS:
                raise ColdsetError(self._failure[1])  # no catalog storm while it is down
            try:
                table = self.store.catalog().load_table(self.identifier)
            except (NoSuchTableError, NoSuchNamespaceError):
                snap = _Snapshot(None, {}, None, now)
            except Exception as error:
                message = f"cannot load table {'.'.join(self.identifier)}: {error}"
                self._failure = (now, message)
                raise ColdsetError(message) from error
            else:
                self._failure = None
                current = table.metadata.current_snapshot()
                snapshot_id = None if current is None else current.snapshot_id
                shape = _shape(table)
                if snap is not None and snap.snapshot_id == snapshot_id:
                    snap.loaded_at = now
                    if snap.shape != shape:  # a schema or property change without new rows
                        snap.encoder = self.store.encoder_for(self.topic, table)
                        snap.shape = shape
                    return snap
                snap = _Snapshot(snapshot_id, table_boundary(table), table, now)
                snap.encoder = self.store.encoder_for(self.topic, table)
                snap.shape = shape
            self._snapshot = snap
            return snap

    def version(self) -> tuple[int | None, Any]:
        """What the rows read now depend on: the current snapshot and the table's shape."""
        snap = self._current()
        return snap.snapshot_id, snap.shape

    def encoder(self) -> PayloadEncoder | None:
        """The payload encoder of the current snapshot (None for a raw table)."""
        return self._current().encoder

    def _files(self, snap: _Snapshot, partition: int) -> list[FileRef]:
        files = snap.files if snap.files is not None else self._plan(snap)
        broken = snap.broken.get(partition)
        if broken is not None:
            raise ColdsetError(broken)
        return files.get(partition, [])

    def _plan(self, snap: _Snapshot) -> dict[int, list[FileRef]]:
        """Every data file of the snapshot grouped by the Kafka partitions it may hold: one
        ``plan_files`` for the table, however many partitions are read (once per snapshot)."""
        with snap.planning:
            if snap.files is not None:
                return snap.files
            files: dict[int, list[FileRef]] = {}
            if snap.table is not None and snap.snapshot_id is not None:
                tasks = self._plan_tasks(snap.table, snap.snapshot_id)
                specs = snap.table.specs()
                positions = {spec_id: _partition_position(spec) for spec_id, spec in specs.items()}
                partitions = sorted(snap.boundary)
                for task in tasks:
                    data = task.file
                    held = _held_partitions(data, positions.get(data.spec_id), partitions)
                    snap.holders[data.file_path] = frozenset(held)
                    ref = _file_ref(data)
                    for partition in held:
                        files.setdefault(partition, []).append(ref)
                        if task.delete_files:
                            snap.broken[partition] = (
                                f"{data.file_path} has delete files; KSI reads append-only tables"
                            )
                for refs in files.values():
                    refs.sort(key=lambda f: (f.low, f.high))
            snap.files = files
            return files

    def _plan_tasks(self, table: Table, snapshot_id: int) -> list[Any]:
        try:
            return list(
                table.scan(snapshot_id=snapshot_id, selected_fields=("kafka_offset",)).plan_files()
            )
        except Exception as error:
            raise ColdsetError(f"cannot plan {'.'.join(self.identifier)}: {error}") from error

    def _siblings(
        self, snap: _Snapshot, ref: SegmentRef, partition: int, siblings: Mapping[int, int] | None
    ) -> list[int]:
        """The partitions of ``siblings`` (partition -> fetch offset) other than ``partition``
        whose data files include row group ``ref`` and whose fetch offset lies within its
        offset range: the row group their own reads would start from."""
        if not siblings:
            return []
        held = snap.holders.get(ref.path, frozenset())
        fewer, more = (held, siblings) if len(held) < len(siblings) else (siblings, held)
        return [
            p for p in fewer if p != partition and p in more and ref.low <= siblings[p] <= ref.high
        ]

    # ------------------------------------------------------------------ queries

    def boundary(self, partition: int) -> int | None:
        """Next offset the pipeline will copy for ``partition``, or None if it has none."""
        return self._current().boundary.get(partition)

    def first_offset(self, partition: int) -> int | None:
        """Lowest cold offset of ``partition`` (manifest bounds), or None without cold rows."""
        snap = self._current()
        if partition not in snap.boundary:
            return None
        files = self._files(snap, partition)
        return min((f.low for f in files), default=None)

    def read(
        self,
        partition: int,
        offset: int,
        want_bytes: int = 0,
        siblings: Mapping[int, int] | None = None,
    ) -> ColdRead | None:
        """The cold rows of ``partition`` from ``offset`` on, within one row group (consecutive
        cached slices of it until about ``want_bytes`` are there); None when no cold row lies
        at or after ``offset`` below the boundary. ``siblings`` are the other partitions (->
        fetch offsets) of this table a Fetch asks: a row group read now is split for those it
        holds too, so their reads find it cached."""
        snap = self._current()
        boundary = snap.boundary.get(partition)
        if boundary is None:
            return None
        files = self._files(snap, partition)
        last = max((f.high for f in files), default=-1)
        while offset < boundary:
            candidates = [f for f in files if f.high >= offset]
            if not candidates:
                return None
            first = candidates[0]
            group = [f for f in candidates if f.low <= first.high]
            refs = [r for f in group for r in self.store.row_groups(f) if r.high >= offset]
            if not refs:
                offset = first.high + 1
                continue
            lead = min(refs, key=lambda r: (r.low, r.high))
            chosen = [r for r in refs if r.low <= lead.high]
            slices: tuple[tuple[tuple[str, int, int, int], int], ...] = ()
            if len(chosen) == 1:  # the usual case: one row group, read slices of it
                also = self._siblings(snap, lead, partition, siblings)
                found = self.store.slices_from(
                    lead, partition, offset, want_bytes, snap.encoder, also
                )
                if not found:
                    offset = lead.high + 1
                    continue
                slices = tuple((key, int(piece.offsets[-1])) for key, piece in found)
                segment = concat_segments([piece for _, piece in found])
            else:  # row groups whose offset ranges overlap: merge them whole
                segment = merge_segments(
                    [self.store.segment(r, partition, snap.encoder) for r in chosen]
                )
            limit = min(lead.high, boundary - 1)
            start = segment.index_of(offset)
            stop = segment.index_after(limit)
            if start >= stop:
                offset = limit + 1
                continue
            end = int(segment.offsets[stop - 1])
            tail = boundary - 1 if end >= last and boundary - 1 > end else None
            return ColdRead(segment, start, stop, tail, slices)
        return None

    def uncached_file(self, partition: int, offset: int) -> str | None:
        """The data file a read of ``partition`` from ``offset`` would start in, when the
        slices it needs are not cached (its footer unread, or its row group's slices of
        ``partition`` not all cached); None when the read needs no file or finds it cached."""
        snap = self._current()
        boundary = snap.boundary.get(partition)
        if boundary is None or offset >= boundary:
            return None
        files = self._files(snap, partition)
        if not files or offset < min(f.low for f in files):
            return None
        first = next((f for f in files if f.high >= offset), None)
        if first is None:
            return None
        refs = self.store.cached_row_groups(first)
        if refs is None:
            return first.path
        later = [r for r in refs if r.high >= offset]
        if not later:
            return None
        lead = min(later, key=lambda r: (r.low, r.high))
        return None if self.store.has_cached(lead, partition) else first.path

    def next_refs(self, partition: int, offset: int, count: int) -> list[SegmentRef]:
        """Up to ``count`` row groups holding offsets from ``offset`` on (for read-ahead)."""
        snap = self._current()
        boundary = snap.boundary.get(partition)
        if boundary is None or count <= 0:
            return []
        out: list[SegmentRef] = []
        for file in self._files(snap, partition):
            if file.high < offset or file.low >= boundary:
                continue
            for ref in self.store.row_groups(file):
                if ref.high >= offset:
                    out.append(ref)
            if len(out) >= count:
                break
        out.sort(key=lambda r: r.low)
        return out[:count]

    def offset_for_timestamp(self, partition: int, timestamp: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first cold record of ``partition`` whose timestamp is
        >= ``timestamp`` (ms), or None; files whose timestamp bound is lower are skipped."""
        snap = self._current()
        boundary = snap.boundary.get(partition)
        if boundary is None:
            return None
        best: tuple[int, int] | None = None
        for file in self._files(snap, partition):
            if best is not None and file.low > best[0]:
                break
            if file.timestamp_high is not None and file.timestamp_high < timestamp:
                continue
            for ref in sorted(self.store.row_groups(file), key=lambda r: r.low):
                if best is not None and ref.low > best[0]:
                    break
                segment = self.store.segment(ref, partition, snap.encoder)
                # Rows are in offset order: the first whose timestamp reaches ``timestamp``,
                # if it lies below the boundary and below the best found so far.
                later = np.flatnonzero(segment.timestamps >= timestamp)
                if len(later):
                    found = int(segment.offsets[later[0]])
                    if found < boundary and (best is None or found < best[0]):
                        best = (found, int(segment.timestamps[later[0]]))
        return best
