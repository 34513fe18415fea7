"""The bytes of a hotset data file: which rows one file holds and how they are written.

A chunk's file holds rows of one time bucket only (a bucket change in offset order ends the
chunk, :func:`build_chunk`), written in one Parquet layout (:func:`parquet_layout`) however the
rows were decoded or sliced, so a file rebuilt from its key alone has the size its index entry
and manifest state. The layout's name (:func:`layout_name`) keys index and cache entries. A
typed topic's rows are decoded into its typed columns (a :class:`RowDecoder`) after the time cut
and before Parquet: the same rows and layout give the same bytes.
"""

from __future__ import annotations

from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc

from bergstream.core.api import ChunkEntry
from bergstream.plugins.isk_gateway.files.data_files import chunk_bounds, column_stats
from bergstream.plugins.isk_gateway.files.synthesis import parquet_bytes, records_to_table
from bergstream.plugins.isk_gateway.kafka.buffers import DECODED_COLUMNS
from bergstream.plugins.isk_gateway.kafka.reader import FetchedRange
from bergstream.plugins.isk_gateway.tables.paths import UNIT_MICROS

__all__ = [
    "LAYOUT_VERSION",
    "RowDecoder",
    "build_chunk",
    "layout_name",
    "parquet_layout",
    "time_buckets",
]

#: Bumped whenever the bytes written for the same rows change (a layout change must never serve
#: a file whose size differs from the one an index entry or a cached manifest states), or what an
#: index entry holds does (an older entry must never be read as a newer one). 3: entries bound the
#: timestamp type, key and value too. 4: row groups of :data:`ROW_GROUP_ROWS` rows. 5: key and
#: value columns the codec does not shrink are written uncompressed (``synthesis.column_codecs``).
LAYOUT_VERSION = 5
#: Rows per Parquet row group of a hotset file: engines scan a file's row groups on several
#: threads, and one group per file (before layout 4) left DuckDB on one core per file; a quarter
#: of the default chunk (``chunk_records``) gives a 1 KB-record file four groups of 25 MB.
ROW_GROUP_ROWS = 25_000


class RowDecoder(Protocol):
    """Turns row-contract rows into a typed layout's rows (:class:`.typed_topic.TypedTopic`)."""

    def decode(self, rows: pa.Table) -> pa.Table:
        """``rows`` (``ROW_ARROW_SCHEMA``) with their values (and keys) decoded into the
        layout's typed columns, in the layout's Arrow schema."""
        ...


def layout_name(unit: str, compression: str) -> str:
    """The name of the files a gateway writes: time unit, codec and :data:`LAYOUT_VERSION`.
    Index entries and cache entries are kept under it, so gateways (or restarts) with other
    settings never read each other's sizes or bytes."""
    return f"{unit}.{compression}.v{LAYOUT_VERSION}"


def parquet_layout(rows: pa.Table, compression: str = "snappy") -> memoryview:
    """The Parquet bytes of ``rows``: one layout for the same rows however they were decoded or
    sliced, so a file rebuilt from its key has the size its manifest entry states. Row groups
    hold :data:`ROW_GROUP_ROWS` rows (a count, never a size in memory, which differs between a
    slice and a copy of the same rows)."""
    return parquet_bytes(rows.combine_chunks(), compression, row_group_rows=ROW_GROUP_ROWS)


def time_buckets(table: pa.Table, unit: str) -> pa.Array:
    """The UTC time bucket (days or hours since the epoch, rounded down) of each row's
    ``kafka_timestamp``."""
    micros = table.column("kafka_timestamp").cast(pa.int64())
    size = pa.scalar(UNIT_MICROS[unit], pa.int64())
    truncated = pc.divide(micros, size)  # integer division, rounding toward zero
    below = pc.and_(pc.less(micros, 0), pc.not_equal(pc.multiply(truncated, size), micros))
    return pc.subtract(truncated, pc.cast(below, pa.int64()))


def build_chunk(
    topic: str,
    partition: int,
    start: int,
    high: int,
    fetched: FetchedRange,
    unit: str,
    compression: str,
    typed: RowDecoder | None = None,
    release: bool = False,
) -> tuple[ChunkEntry, bytes | memoryview]:
    """The chunk starting at ``start`` of the rows of ``[start, high)`` in ``fetched``: its
    index entry and its Parquet bytes (rows decoded by ``typed`` for a typed topic). It ends at
    ``high``, or earlier at the first row of another time bucket than the first row's; a range
    without rows gives an empty entry and no bytes. The entry's bounds are of contract columns
    only, taken from the rows as written (decoded for a typed topic). With ``release``,
    ``fetched``'s buffers go back to their pool when done (call it on the thread that decodes:
    a cancelled caller does not stop that thread)."""
    # Plain rows are garbage once written and bounded, so their columns reuse pooled buffers.
    lease = DECODED_COLUMNS.lease() if typed is None else None
    try:
        table = records_to_table(fetched.records, partition, start, high, fetched.aborted, lease)
        if not table.num_rows:
            return ChunkEntry(topic, partition, start, high, 0, 0, {}), b""
        buckets = time_buckets(table, unit)
        other = pc.not_equal(buckets, buckets[0])
        chunk_end = high
        rows = table
        if pc.any(other).as_py():
            cut = pc.index(other, True).as_py()
            chunk_end = table.column("kafka_offset")[cut].as_py()
            rows = table.slice(0, cut)  # rows are in offset order
        written = typed.decode(rows) if typed is not None else rows
        parquet = parquet_layout(written, compression)
        low_ts, high_ts = pc.min_max(rows.column("kafka_timestamp").cast(pa.int64())).values()
        offsets = rows.column("kafka_offset")
        entry = ChunkEntry(
            topic=topic,
            partition=partition,
            start_offset=start,
            end_offset=chunk_end,
            row_count=rows.num_rows,
            size_bytes=len(parquet),
            bounds=chunk_bounds(
                partition,
                (offsets[0].as_py(), offsets[-1].as_py()),
                (low_ts.as_py(), high_ts.as_py()),
            )
            | column_stats(written),
        )
        return entry, parquet
    finally:
        if lease is not None:
            lease.release()
        if release:
            fetched.release()
