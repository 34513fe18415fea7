"""Decoded coldset rows: a *segment* is one Parquet row group's rows of one Kafka partition,
sorted by offset, with offsets, timestamps and timestamp types as int64 NumPy arrays and the
payload columns kept in Arrow until a batch needs them.

A typed table's rows hold their values (and keys) as columns: a :data:`PayloadEncoder` gives
their original bytes back, once per decoded slice, on the slice's first use (a fetch, or the
store's read-ahead in the background), so the cached payload is what was produced."""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bergstream.core.api import Record

#: Bytes per row of a segment's offset, timestamp and timestamp type arrays (three int64).
ROW_ARRAYS_BYTES = 24

#: Row groups of more decoded bytes than this are read with Arrow's threads.
_THREADED_BYTES = 4 * 1024 * 1024

#: Columns a segment reads (the row contract's names).
READ_COLUMNS = (
    "kafka_partition",
    "kafka_offset",
    "kafka_timestamp",
    "kafka_timestamp_type",
    "kafka_key",
    "kafka_headers",
    "kafka_value",
)
PAYLOAD_COLUMNS = ("kafka_key", "kafka_value", "kafka_headers")

#: Turns rows of one partition (every column of the data file) into the PAYLOAD_COLUMNS of
#: their original records (a typed table's); None for a raw table, whose payload is read as is.
PayloadEncoder = Callable[[pa.Table], pa.Table]


@dataclass(frozen=True, slots=True)
class SegmentRef:
    """Where a segment comes from and the offset range its statistics promise."""

    path: str
    row_group: int
    low: int
    high: int


class Payload:
    """The PAYLOAD_COLUMNS of a segment's rows: given, or made once on first use (encoded from
    a typed table's rows, or joined from other segments' payloads). A failure to make it is
    raised to that caller and tried again by the next one (a registry may come back)."""

    __slots__ = ("_lock", "_make", "_table")

    def __init__(
        self, table: pa.Table | None = None, make: Callable[[], pa.Table] | None = None
    ) -> None:
        if (table is None) == (make is None):
            raise ValueError("a payload is either a table or a way to make one")
        self._table = table
        self._make = make
        self._lock = threading.Lock()

    @property
    def ready(self) -> bool:
        """Whether the table is made."""
        return self._table is not None

    def get(self) -> pa.Table:
        """The payload table (made now if it is not yet, once however many threads ask)."""
        table = self._table
        if table is None:
            with self._lock:
                if self._table is None:
                    assert self._make is not None
                    self._table = self._make()
                    self._make = None  # frees the typed rows it encoded
                table = self._table
        return table


@dataclass(frozen=True)
class Segment:
    """Rows of one Kafka partition sorted by offset (no duplicate offsets)."""

    offsets: np.ndarray  # int64
    timestamps: np.ndarray  # int64, ms
    timestamp_types: np.ndarray  # int64
    source: Payload  # PAYLOAD_COLUMNS, row i matches offsets[i]
    nbytes: int

    @property
    def payload(self) -> pa.Table:
        """The payload columns (encoded now if they are not yet)."""
        return self.source.get()

    def __len__(self) -> int:
        return len(self.offsets)

    def index_of(self, offset: int) -> int:
        """Index of the first row whose offset is >= ``offset``."""
        return int(np.searchsorted(self.offsets, offset, side="left"))

    def index_after(self, offset: int) -> int:
        """Index of the first row whose offset is > ``offset``."""
        return int(np.searchsorted(self.offsets, offset, side="right"))

    def records(self, start: int, stop: int) -> list[tuple[int, Record]]:
        """Rows ``start:stop`` as (timestamp type, record) pairs."""
        part = self.payload.slice(start, stop - start)
        keys = part.column("kafka_key").to_pylist()
        values = part.column("kafka_value").to_pylist()
        headers = part.column("kafka_headers").to_pylist()
        out = []
        for i in range(stop - start):
            row_headers = headers[i]
            out.append(
                (
                    int(self.timestamp_types[start + i]),
                    Record(
                        offset=int(self.offsets[start + i]),
                        timestamp=int(self.timestamps[start + i]),
                        key=keys[i],
                        value=values[i],
                        headers=tuple((h["key"], h["value"]) for h in row_headers)
                        if row_headers
                        else (),
                    ),
                )
            )
        return out


def _int64(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """An integer column as an int64 array of its own (a copy: a cached slice must not keep the
    row group's buffers alive)."""
    return np.array(column.to_numpy(), dtype=np.int64)


def decode_segment(rows: pa.Table, partition: int, encode: PayloadEncoder | None = None) -> Segment:
    """Keep ``partition``'s rows of an Arrow table in the row contract, sorted by offset, one
    row per offset; ``encode`` makes the payload of a typed table's rows on first use."""
    # Row groups usually hold one partition's rows in offset order (the table's sort order):
    # then no column is copied to filter or sort them.
    if not (rows.column("kafka_partition").to_numpy() == partition).all():
        rows = rows.filter(pc.equal(rows.column("kafka_partition"), partition))
    ordered = rows.column("kafka_offset").to_numpy()
    if len(ordered) > 1 and not (np.diff(ordered) > 0).all():
        rows = rows.take(pc.sort_indices(rows.column("kafka_offset")))  # stable
        ordered = rows.column("kafka_offset").to_numpy()
        first = np.concatenate([[True], np.diff(ordered) != 0])  # first row of each offset
        if not first.all():
            rows = rows.filter(pa.array(first))
    offsets = _int64(rows.column("kafka_offset"))
    micros = _int64(rows.column("kafka_timestamp").cast(pa.int64()))
    if encode is None:
        source = Payload(rows.select(list(PAYLOAD_COLUMNS)))
        size = source.get().nbytes
    else:
        typed = rows
        source = Payload(make=lambda: encode(typed))
        size = typed.nbytes  # about the size of the payload it becomes
    return Segment(
        offsets=offsets,
        timestamps=micros // 1000,  # floor, as the row contract's microseconds came from ms
        timestamp_types=_int64(rows.column("kafka_timestamp_type")),
        source=source,
        nbytes=size + ROW_ARRAYS_BYTES * len(offsets),
    )


def merge_segments(segments: list[Segment]) -> Segment:
    """One segment holding the rows of ``segments`` (which may overlap), sorted by offset."""
    if len(segments) == 1:
        return segments[0]
    offsets = np.concatenate([segment.offsets for segment in segments])
    order = np.argsort(offsets, kind="stable")  # equal offsets: the earlier segment's row
    ordered = offsets[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = ordered[1:] != ordered[:-1]
    picks = order[first]
    rows = pa.array(picks, pa.int64())

    def make() -> pa.Table:
        combined = pa.concat_tables([segment.payload for segment in segments]).combine_chunks()
        return combined.take(rows)

    return Segment(
        offsets=offsets[picks],
        timestamps=np.concatenate([segment.timestamps for segment in segments])[picks],
        timestamp_types=np.concatenate([segment.timestamp_types for segment in segments])[picks],
        source=Payload(make=make),
        nbytes=sum(segment.nbytes for segment in segments),
    )


def concat_segments(segments: list[Segment]) -> Segment:
    """Segments in offset order whose ranges do not overlap, as one."""
    if len(segments) == 1:
        return segments[0]
    return Segment(
        offsets=np.concatenate([segment.offsets for segment in segments]),
        timestamps=np.concatenate([segment.timestamps for segment in segments]),
        timestamp_types=np.concatenate([segment.timestamp_types for segment in segments]),
        source=Payload(make=lambda: pa.concat_tables([s.payload for s in segments])),
        nbytes=sum(segment.nbytes for segment in segments),
    )


def _in_order(slices: list[Segment]) -> bool:
    return all(later.offsets[0] > earlier.offsets[-1] for earlier, later in pairwise(slices))


def read_row_group_slices(
    parquet: pq.ParquetFile,
    row_group: int,
    partition: int,
    slice_bytes: int,
    encode: PayloadEncoder | None = None,
) -> list[Segment]:
    """One row group's rows of ``partition`` as non-empty slices of about ``slice_bytes``
    decoded bytes, in offset order, each with buffers of its own (so evicting one frees it).
    Rows written out of offset order are read whole, sorted, then cut. With ``encode`` (a
    typed table) every column is read and each slice's payload is encoded once."""
    return read_row_group_partitions(parquet, row_group, [partition], slice_bytes, encode)[
        partition
    ]


def read_row_group_partitions(
    parquet: pq.ParquetFile,
    row_group: int,
    partitions: Collection[int],
    slice_bytes: int,
    encode: PayloadEncoder | None = None,
) -> dict[int, list[Segment]]:
    """:func:`read_row_group_slices` for each of ``partitions`` at once: the row group is read
    and decoded once, each batch of it split by partition, so every partition gets the slices
    it would get read alone (an empty list for a partition without rows there)."""
    metadata = parquet.metadata.row_group(row_group)
    rows = max(metadata.num_rows, 1)
    per_slice = max(64, slice_bytes * rows // max(metadata.total_byte_size, 1))
    columns = list(READ_COLUMNS) if encode is None else None
    wanted = set(partitions)
    slices: dict[int, list[Segment]] = {partition: [] for partition in wanted}
    batches = parquet.iter_batches(
        batch_size=per_slice,
        row_groups=[row_group],
        columns=columns,
        # Decoding a small row group's columns on Arrow's threads costs more than it saves.
        use_threads=metadata.total_byte_size > _THREADED_BYTES,
    )
    for batch in batches:
        for partition, part in split_by_partition(pa.Table.from_batches([batch]), wanted):
            piece = decode_segment(part, partition, encode)
            if len(piece):
                slices[partition].append(piece)
    disordered = [partition for partition, pieces in slices.items() if not _in_order(pieces)]
    if disordered:
        whole = parquet.read_row_group(row_group, columns=columns)
        for partition in disordered:
            slices[partition] = _cut(decode_segment(whole, partition, encode), per_slice)
    return slices


def split_by_partition(rows: pa.Table, wanted: Collection[int]) -> list[tuple[int, pa.Table]]:
    """The rows of each ``wanted`` partition in ``rows`` (in their order), one table each; a
    table of one partition is passed through without a copy."""
    values = rows.column("kafka_partition").to_numpy()
    if not len(values):
        return []
    first = int(values[0])
    if (values == first).all():  # the usual case: row groups hold one partition's rows
        return [(first, rows)] if first in wanted else []
    order = np.argsort(values, kind="stable")  # each partition's rows keep their order
    ordered = values[order]
    present, starts = np.unique(ordered, return_index=True)
    ends = [*starts[1:].tolist(), len(ordered)]
    return [
        (int(partition), rows.take(pa.array(order[start:end])))
        for partition, start, end in zip(present.tolist(), starts.tolist(), ends, strict=True)
        if partition in wanted
    ]


def _cut(whole: Segment, per_slice: int) -> list[Segment]:
    """A segment cut into slices of ``per_slice`` rows with payloads of their own."""
    out = []
    for start in range(0, len(whole), per_slice):
        stop = min(start + per_slice, len(whole))
        payload = whole.payload.take(pa.array(range(start, stop), pa.int64()))  # rare: eager
        out.append(
            Segment(
                offsets=whole.offsets[start:stop].copy(),
                timestamps=whole.timestamps[start:stop].copy(),
                timestamp_types=whole.timestamp_types[start:stop].copy(),
                source=Payload(payload),
                nbytes=payload.nbytes + ROW_ARRAYS_BYTES * (stop - start),
            )
        )
    return out


def row_group_offset_range(metadata: Any, row_group: int, column: int) -> tuple[int, int] | None:
    """(min, max) kafka_offset of a row group from its Parquet statistics, if written."""
    stats = metadata.row_group(row_group).column(column).statistics
    if stats is None or not stats.has_min_max:
        return None
    return int(stats.min), int(stats.max)
