"""Decoded coldset rows: a *segment* is one Parquet row group's rows of one Kafka partition,
sorted by offset, with offsets and timestamps as Python ints and the payload columns kept in
Arrow until a batch needs them."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bergstream.core.api import Record

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


@dataclass(frozen=True, slots=True)
class SegmentRef:
    """Where a segment comes from and the offset range its statistics promise."""

    path: str
    row_group: int
    low: int
    high: int


@dataclass(frozen=True)
class Segment:
    """Rows of one Kafka partition sorted by offset (no duplicate offsets)."""

    offsets: list[int]
    timestamps: list[int]  # ms
    timestamp_types: list[int]
    payload: pa.Table  # PAYLOAD_COLUMNS, row i matches offsets[i]
    nbytes: int

    def __len__(self) -> int:
        return len(self.offsets)

    def index_of(self, offset: int) -> int:
        """Index of the first row whose offset is >= ``offset``."""
        return bisect_left(self.offsets, offset)

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
                    self.timestamp_types[start + i],
                    Record(
                        offset=self.offsets[start + i],
                        timestamp=self.timestamps[start + i],
                        key=keys[i],
                        value=values[i],
                        headers=tuple((h["key"], h["value"]) for h in row_headers)
                        if row_headers
                        else (),
                    ),
                )
            )
        return out


def decode_segment(rows: pa.Table, partition: int) -> Segment:
    """Keep ``partition``'s rows of an Arrow table in the row contract, sorted by offset, one
    row per offset."""
    rows = rows.filter(pc.equal(rows.column("kafka_partition"), partition))
    if rows.num_rows > 1:
        rows = rows.take(pc.sort_indices(rows.column("kafka_offset")))
    offsets: list[int] = rows.column("kafka_offset").to_pylist()
    keep: list[int] | None = None
    if any(offsets[i] == offsets[i - 1] for i in range(1, len(offsets))):
        keep = [i for i in range(len(offsets)) if i == 0 or offsets[i] != offsets[i - 1]]
        rows = rows.take(pa.array(keep, pa.int64()))
        offsets = [offsets[i] for i in keep]
    micros = rows.column("kafka_timestamp").cast(pa.int64()).to_pylist()
    payload = rows.select(list(PAYLOAD_COLUMNS))
    return Segment(
        offsets=offsets,
        timestamps=[value // 1000 for value in micros],
        timestamp_types=rows.column("kafka_timestamp_type").to_pylist(),
        payload=payload,
        nbytes=payload.nbytes + 120 * len(offsets),
    )


def merge_segments(segments: list[Segment]) -> Segment:
    """One segment holding the rows of ``segments`` (which may overlap), sorted by offset."""
    if len(segments) == 1:
        return segments[0]
    order = sorted(
        (offset, s, i)
        for s, segment in enumerate(segments)
        for i, offset in enumerate(segment.offsets)
    )
    picks: list[tuple[int, int, int]] = []
    for item in order:
        if not picks or picks[-1][0] != item[0]:
            picks.append(item)
    tables = [segment.payload for segment in segments]
    bases = [0]
    for table in tables[:-1]:
        bases.append(bases[-1] + table.num_rows)
    combined = pa.concat_tables(tables).combine_chunks()
    taken = combined.take(pa.array([bases[s] + i for _, s, i in picks], pa.int64()))
    return Segment(
        offsets=[offset for offset, _, _ in picks],
        timestamps=[segments[s].timestamps[i] for _, s, i in picks],
        timestamp_types=[segments[s].timestamp_types[i] for _, s, i in picks],
        payload=taken,
        nbytes=taken.nbytes + 120 * len(picks),
    )


def concat_segments(segments: list[Segment]) -> Segment:
    """Segments in offset order whose ranges do not overlap, as one."""
    if len(segments) == 1:
        return segments[0]
    payload = pa.concat_tables([segment.payload for segment in segments])
    return Segment(
        offsets=[o for segment in segments for o in segment.offsets],
        timestamps=[t for segment in segments for t in segment.timestamps],
        timestamp_types=[t for segment in segments for t in segment.timestamp_types],
        payload=payload,
        nbytes=sum(segment.nbytes for segment in segments),
    )


def _in_order(slices: list[Segment]) -> bool:
    return all(later.offsets[0] > earlier.offsets[-1] for earlier, later in pairwise(slices))


def read_row_group_slices(
    parquet: pq.ParquetFile, row_group: int, partition: int, slice_bytes: int
) -> list[Segment]:
    """One row group's rows of ``partition`` as non-empty slices of about ``slice_bytes``
    decoded bytes, in offset order, each with buffers of its own (so evicting one frees it).
    Rows written out of offset order are read whole, sorted, then cut."""
    metadata = parquet.metadata.row_group(row_group)
    rows = max(metadata.num_rows, 1)
    per_slice = max(64, slice_bytes * rows // max(metadata.total_byte_size, 1))
    slices = [
        decode_segment(pa.Table.from_batches([batch]), partition)
        for batch in parquet.iter_batches(
            batch_size=per_slice, row_groups=[row_group], columns=list(READ_COLUMNS)
        )
    ]
    slices = [piece for piece in slices if piece.offsets]
    if _in_order(slices):
        return slices
    whole = decode_segment(parquet.read_row_group(row_group, columns=list(READ_COLUMNS)), partition)
    out = []
    for start in range(0, len(whole), per_slice):
        stop = min(start + per_slice, len(whole))
        payload = whole.payload.take(pa.array(range(start, stop), pa.int64()))
        out.append(
            Segment(
                offsets=whole.offsets[start:stop],
                timestamps=whole.timestamps[start:stop],
                timestamp_types=whole.timestamp_types[start:stop],
                payload=payload,
                nbytes=payload.nbytes + 120 * (stop - start),
            )
        )
    return out


def row_group_offset_range(metadata: Any, row_group: int, column: int) -> tuple[int, int] | None:
    """(min, max) kafka_offset of a row group from its Parquet statistics, if written."""
    stats = metadata.row_group(row_group).column(column).statistics
    if stats is None or not stats.has_min_max:
        return None
    return int(stats.min), int(stats.max)
