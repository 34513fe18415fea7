"""Iceberg ``DataFile`` entries of hotset chunks, from the chunk index alone (no file is read).

A chunk's ``bounds`` hold the lower and upper ``kafka_partition``, ``kafka_offset`` and
``kafka_timestamp`` (µs) of its rows (see :func:`chunk_bounds`), its ``size_bytes`` the exact size
of its synthesized Parquet file; its key (:func:`chunk_key`, see :mod:`..tables.paths`) names its
partition, offset range and time bucket. Chunks are grouped one manifest per Kafka partition
(:func:`hotset_groups`).
"""

from __future__ import annotations

from collections.abc import Sequence

from pyiceberg.conversions import to_bytes
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.transforms import DayTransform, HourTransform, IdentityTransform
from pyiceberg.typedef import Record as IcebergRecord
from pyiceberg.types import IntegerType, LongType, TimestamptzType

from bergstream.core.api import (
    HOUR_PARTITION_SPEC,
    OFFSET_ID,
    PARTITION_ID,
    PARTITION_SPEC,
    SORT_ORDER,
    TIMESTAMP_ID,
    TIMESTAMP_TYPE_ID,
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
    "BOUND_COLUMNS",
    "chunk_bounds",
    "chunk_bucket",
    "chunk_day",
    "chunk_key",
    "chunks_timestamp_ms",
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
_REQUIRED_IDS = (PARTITION_ID, OFFSET_ID, TIMESTAMP_ID, TIMESTAMP_TYPE_ID)


def chunk_bounds(partition: int, offsets: tuple[int, int], timestamps_us: tuple[int, int]) -> dict:
    """The ``bounds`` an index entry holds for a chunk with rows (values as Iceberg stores them:
    ints, timestamps in µs)."""
    return {
        "kafka_partition": (partition, partition),
        "kafka_offset": (int(offsets[0]), int(offsets[1])),
        "kafka_timestamp": (int(timestamps_us[0]), int(timestamps_us[1])),
    }


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
    offset and timestamp, counts of the required ones): typed columns have none, so none can be
    wrong, whatever the layout."""
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
    file = DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=uri(bucket, key),
        file_format=FileFormat.PARQUET,
        partition=IcebergRecord(chunk.partition, chunk_bucket(chunk, partition_unit)),
        record_count=chunk.row_count,
        file_size_in_bytes=chunk.size_bytes,
        column_sizes=None,
        value_counts={field_id: chunk.row_count for field_id in _REQUIRED_IDS},
        null_value_counts={field_id: 0 for field_id in _REQUIRED_IDS},
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
