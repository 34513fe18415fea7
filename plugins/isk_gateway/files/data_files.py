"""Iceberg ``DataFile`` entries of hotset chunks, from the chunk index alone (no file is read).

A chunk's ``bounds`` hold the lower and upper ``kafka_partition``, ``kafka_offset`` and
``kafka_timestamp`` (µs) of its rows (see :func:`chunk_bounds`) and, from the file's own columns
(:func:`column_stats`), those of ``kafka_timestamp_type``, ``kafka_key`` and ``kafka_value``
(binary bounds truncated to :data:`BINARY_BOUND_LENGTH` bytes, as Iceberg's default
``truncate(16)`` metrics mode does) with the key's and value's null counts; its ``size_bytes``
the exact size of its synthesized Parquet file; its key (:func:`chunk_key`, see
:mod:`..tables.paths`) names its partition, offset range and time bucket. Chunks are grouped
one manifest per Kafka partition (:func:`hotset_groups`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.conversions import to_bytes
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.transforms import DayTransform, HourTransform, IdentityTransform
from pyiceberg.typedef import Record as IcebergRecord
from pyiceberg.types import BinaryType, IntegerType, LongType, PrimitiveType, TimestamptzType

from bergstream.core.api import (
    HOUR_PARTITION_SPEC,
    KEY_ID,
    OFFSET_ID,
    PARTITION_ID,
    PARTITION_SPEC,
    SORT_ORDER,
    TIMESTAMP_ID,
    TIMESTAMP_TYPE_ID,
    VALUE_ID,
    ChunkEntry,
)
from bergstream.plugins.isk_gateway.files.manifests import ManifestGroup
from bergstream.plugins.isk_gateway.tables.paths import (
    DAY,
    HOTSET,
    HOUR,
    UNIT_MICROS,
    DataKey,
    uri,
)

__all__ = [
    "BINARY_BOUND_LENGTH",
    "BOUND_COLUMNS",
    "NULL_COUNTS",
    "STAT_COLUMNS",
    "binary_lower_bound",
    "binary_upper_bound",
    "chunk_bounds",
    "chunk_bucket",
    "chunk_day",
    "chunk_key",
    "chunks_timestamp_ms",
    "column_stats",
    "data_file",
    "hotset_groups",
    "spec_for",
    "spec_unit",
]

_BOUND_TYPES = {
    "kafka_partition": (PARTITION_ID, IntegerType()),
    "kafka_offset": (OFFSET_ID, LongType()),
    "kafka_timestamp": (TIMESTAMP_ID, TimestamptzType()),
}
#: The columns an index entry holds bounds of.
BOUND_COLUMNS: tuple[str, ...] = tuple(_BOUND_TYPES)

# Bounds an index entry holds when its file has the column (every layout of this version: a
# typed layout keeps the row contract's columns); written by :func:`column_stats`.
_STAT_TYPES: dict[str, tuple[int, PrimitiveType]] = {
    "kafka_timestamp_type": (TIMESTAMP_TYPE_ID, IntegerType()),
    "kafka_key": (KEY_ID, BinaryType()),
    "kafka_value": (VALUE_ID, BinaryType()),
}
#: The columns :func:`column_stats` bounds, beyond :data:`BOUND_COLUMNS`.
STAT_COLUMNS: tuple[str, ...] = tuple(_STAT_TYPES)
#: The bounds entry holding the (key, value) null counts of a chunk's file.
NULL_COUNTS = "null_counts"
#: Length binary bounds are cut to (Iceberg's default metrics mode is ``truncate(16)``).
BINARY_BOUND_LENGTH = 16
_REQUIRED_IDS = (PARTITION_ID, OFFSET_ID, TIMESTAMP_ID, TIMESTAMP_TYPE_ID)


def chunk_bounds(partition: int, offsets: tuple[int, int], timestamps_us: tuple[int, int]) -> dict:
    """The ``bounds`` an index entry holds for a chunk with rows (values as Iceberg stores them:
    ints, timestamps in µs)."""
    return {
        "kafka_partition": (partition, partition),
        "kafka_offset": (int(offsets[0]), int(offsets[1])),
        "kafka_timestamp": (int(timestamps_us[0]), int(timestamps_us[1])),
    }


def binary_lower_bound(value: bytes, length: int = BINARY_BOUND_LENGTH) -> bytes:
    """A lower bound of ``value`` at most ``length`` bytes long: its prefix."""
    return bytes(value[:length])


def binary_upper_bound(value: bytes, length: int = BINARY_BOUND_LENGTH) -> bytes | None:
    """An upper bound of ``value`` at most ``length`` bytes long: ``value`` itself if it fits,
    else its prefix with the last byte below 0xFF incremented (the bytes after it dropped), so
    it sorts above every value with that prefix; None if the prefix is all 0xFF (no bound)."""
    if len(value) <= length:
        return bytes(value)
    prefix = bytearray(value[:length])
    while prefix:
        if prefix[-1] < 0xFF:
            prefix[-1] += 1
            return bytes(prefix)
        prefix.pop()
    return None


def column_stats(rows: pa.Table) -> dict[str, tuple[Any, Any]]:
    """Bounds of ``kafka_timestamp_type``, ``kafka_key`` and ``kafka_value`` over the rows a
    file holds (those it has), and the key's and value's null counts (under
    :data:`NULL_COUNTS`), for an index entry. A column with no value has no bounds; a binary
    upper bound that cannot be truncated (a prefix of 0xFF bytes only) is None."""
    stats: dict[str, tuple[Any, Any]] = {}
    names = set(rows.column_names)
    if "kafka_timestamp_type" in names:
        low, high = pc.min_max(rows.column("kafka_timestamp_type")).values()
        if low.is_valid:
            stats["kafka_timestamp_type"] = (int(low.as_py()), int(high.as_py()))
    if not {"kafka_key", "kafka_value"} <= names:
        return stats
    nulls = []
    for name in ("kafka_key", "kafka_value"):
        column = rows.column(name)
        nulls.append(column.null_count)
        if column.null_count == len(column):
            continue
        low, high = pc.min_max(column).values()
        stats[name] = (binary_lower_bound(low.as_py()), binary_upper_bound(high.as_py()))
    stats[NULL_COUNTS] = (nulls[0], nulls[1])
    return stats


def chunk_day(chunk: ChunkEntry) -> int | None:
    """The day (days since the epoch) of a chunk's rows; None for a chunk without rows."""
    return chunk_bucket(chunk, DAY)


def chunk_bucket(chunk: ChunkEntry, unit: str) -> int | None:
    """The time bucket (days or hours since the epoch, per ``unit``) of a chunk's rows; None for
    a chunk without rows."""
    if not chunk.row_count:
        return None
    return int(chunk.bounds["kafka_timestamp"][0]) // UNIT_MICROS[unit]


def chunk_key(
    cluster: str,
    chunk: ChunkEntry,
    unit: str,
    namespace: str = HOTSET,
    layout: str | None = None,
) -> DataKey:
    """The data key of a chunk's file cut by ``unit``, under ``namespace`` (hotset, or merged
    for its alias), its rows decoded into the typed layout ``layout`` names (None: raw)."""
    return DataKey(
        cluster,
        chunk.topic,
        chunk.partition,
        chunk_bucket(chunk, unit),
        chunk.start_offset,
        chunk.end_offset,
        namespace,
        unit,
        layout,
    )


def spec_for(unit: str) -> PartitionSpec:
    """The hotset's partition spec for a time unit (day: the row contract's default spec)."""
    return HOUR_PARTITION_SPEC if unit == HOUR else PARTITION_SPEC


def spec_unit(spec: PartitionSpec) -> str | None:
    """The time unit of a row-contract-like spec (identity ``kafka_partition``, then ``day`` or
    ``hour`` of ``kafka_timestamp``); None if ``spec`` is not like that."""
    fields = [(f.source_id, f.transform) for f in spec.fields]
    if len(fields) != 2 or fields[0] != (PARTITION_ID, IdentityTransform()):
        return None
    source, transform = fields[1]
    if source != TIMESTAMP_ID:
        return None
    if isinstance(transform, DayTransform):
        return DAY
    return HOUR if isinstance(transform, HourTransform) else None


def data_file(
    bucket: str,
    cluster: str,
    chunk: ChunkEntry,
    namespace: str = HOTSET,
    unit: str = DAY,
    spec: PartitionSpec = PARTITION_SPEC,
    layout: str | None = None,
) -> DataFile:
    """The ``DataFile`` of a chunk with rows, stats from the index entry: its key cut by
    ``unit`` (in typed layout ``layout``, None: raw), its partition value in ``spec`` (whose
    time unit is ``unit`` or coarser). Only contract columns get stats (bounds of partition,
    offset and timestamp, counts of the required ones, and whatever :func:`column_stats` put in
    the entry: timestamp type, key and value): typed columns have none, so none can be wrong,
    whatever the layout."""
    key = chunk_key(cluster, chunk, unit, namespace, layout).key
    partition_unit = spec_unit(spec)
    if partition_unit is None:
        raise ValueError(f"spec {spec} does not partition like the row contract")
    lower: dict[int, bytes] = {}
    upper: dict[int, bytes] = {}
    for column, (field_id, type_) in _BOUND_TYPES.items():
        low, high = chunk.bounds[column]
        lower[field_id] = to_bytes(type_, int(low))
        upper[field_id] = to_bytes(type_, int(high))
    value_counts = dict.fromkeys(_REQUIRED_IDS, chunk.row_count)
    null_counts = dict.fromkeys(_REQUIRED_IDS, 0)
    for column, (field_id, type_) in _STAT_TYPES.items():
        low, high = chunk.bounds.get(column, (None, None))
        if low is not None:
            lower[field_id] = to_bytes(type_, low)
        if high is not None:
            upper[field_id] = to_bytes(type_, high)
    if NULL_COUNTS in chunk.bounds:
        for field_id, nulls in zip((KEY_ID, VALUE_ID), chunk.bounds[NULL_COUNTS], strict=True):
            value_counts[field_id] = chunk.row_count
            null_counts[field_id] = int(nulls)
    file = DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=uri(bucket, key),
        file_format=FileFormat.PARQUET,
        partition=IcebergRecord(chunk.partition, chunk_bucket(chunk, partition_unit)),
        record_count=chunk.row_count,
        file_size_in_bytes=chunk.size_bytes,
        column_sizes=None,
        value_counts=value_counts,
        null_value_counts=null_counts,
        nan_value_counts=None,
        lower_bounds=lower,
        upper_bounds=upper,
        key_metadata=None,
        split_offsets=None,
        equality_ids=None,
        sort_order_id=SORT_ORDER.order_id,
    )
    file.spec_id = spec.spec_id
    return file


def hotset_groups(
    bucket: str,
    cluster: str,
    chunks: Sequence[ChunkEntry],
    namespace: str = HOTSET,
    unit: str = DAY,
    spec: PartitionSpec | None = None,
    layout: str | None = None,
) -> list[ManifestGroup]:
    """One manifest group per Kafka partition over the chunks with rows, in offset order (data
    keys under ``namespace``: hotset, or merged for its aliases; chunks cut by ``unit``; partition
    values in ``spec``, by default the hotset's spec for ``unit``; rows in the typed layout
    ``layout`` names, None: raw)."""
    spec = spec or spec_for(unit)
    with_rows = sorted(
        (c for c in chunks if c.row_count), key=lambda c: (c.partition, c.start_offset)
    )
    return [
        ManifestGroup(
            spec,
            [
                data_file(bucket, cluster, c, namespace, unit, spec, layout)
                for c in with_rows
                if c.partition == partition
            ],
        )
        for partition in sorted({c.partition for c in with_rows})
    ]


def chunks_timestamp_ms(chunks: Sequence[ChunkEntry]) -> int:
    """The newest row timestamp (ms) among ``chunks``; 0 if none has rows."""
    highs = [int(c.bounds["kafka_timestamp"][1]) for c in chunks if c.row_count]
    return max(highs) // 1000 if highs else 0
