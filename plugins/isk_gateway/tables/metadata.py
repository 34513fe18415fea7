"""Deterministic hotset table metadata from the chunk index: DataFiles, manifests, manifest list,
``TableMetadataV2``.

The same state (topic, chunks, end offsets) gives byte-identical files: the snapshot id is a hash
of the state (positive int64), Avro sync markers are derived from each file's key instead of
``os.urandom``, timestamps come from the data, and every key names its content (see
:mod:`.paths`). DataFile stats come from the index: a chunk's ``bounds`` hold the lower and upper
``kafka_partition``, ``kafka_offset`` and ``kafka_timestamp`` (µs) of its rows (see
:func:`chunk_bounds`), its ``size_bytes`` the exact size of its synthesized Parquet file.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyiceberg.avro.file import AvroOutputFile
from pyiceberg.conversions import to_bytes
from pyiceberg.manifest import (
    DEFAULT_READ_VERSION,
    MANIFEST_LIST_FILE_SCHEMAS,
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestListWriter,
    ManifestListWriterV2,
    ManifestWriterV2,
)
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.metadata import TableMetadataV2
from pyiceberg.table.refs import SnapshotRef, SnapshotRefType
from pyiceberg.table.snapshots import Operation, Snapshot, SnapshotLogEntry, Summary
from pyiceberg.table.sorting import SortOrder
from pyiceberg.transforms import DayTransform, HourTransform, IdentityTransform
from pyiceberg.typedef import Record as IcebergRecord
from pyiceberg.types import IntegerType, LongType, TimestamptzType

from bergstream.core.backends import ChunkEntry
from bergstream.core.row_contract import (
    HOUR_PARTITION_SPEC,
    OFFSET_ID,
    PARTITION_ID,
    PARTITION_SPEC,
    ROW_SCHEMA,
    SORT_ORDER,
    TIMESTAMP_ID,
    TIMESTAMP_TYPE_ID,
    format_boundary,
)
from bergstream.plugins.isk_gateway.tables.fileio import MemoryOutputFile
from bergstream.plugins.isk_gateway.tables.paths import (
    DAY,
    HOTSET,
    HOUR,
    UNIT_MICROS,
    DataKey,
    ManifestKey,
    ManifestListKey,
    MetadataKey,
    table_location,
    uri,
)

__all__ = [
    "HOTSET_OFFSETS_PROPERTY",
    "BuiltTable",
    "ManifestGroup",
    "SnapshotPlan",
    "build_metadata",
    "build_table",
    "chunk_bounds",
    "chunk_bucket",
    "chunk_day",
    "chunks_timestamp_ms",
    "data_file",
    "hotset_groups",
    "snapshot_id_of",
    "spec_for",
    "spec_unit",
    "sync_marker",
]

#: Snapshot summary key: next offset per partition the hotset snapshot covers, as JSON.
HOTSET_OFFSETS_PROPERTY = "bergstream.hotset-offsets"

_US_PER_DAY = 86_400_000_000
_MAX_INT64 = 2**63 - 1
_SEQUENCE_NUMBER = 1
_AVRO_CODEC = "null"
_BOUND_TYPES = {
    "kafka_partition": (PARTITION_ID, IntegerType()),
    "kafka_offset": (OFFSET_ID, LongType()),
    "kafka_timestamp": (TIMESTAMP_ID, TimestamptzType()),
}
_REQUIRED_IDS = (PARTITION_ID, OFFSET_ID, TIMESTAMP_ID, TIMESTAMP_TYPE_ID)
_UUID_NAMESPACE = uuid.UUID("8f0e3c52-5d2e-4b8a-9a43-62a1c0d7b0f1")


def sync_marker(key: str) -> bytes:
    """The 16-byte Avro sync marker of the file at ``key`` (fixed, so rebuilds are identical)."""
    return hashlib.sha256(b"bergstream-avro-sync:" + key.encode()).digest()[:16]


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
) -> DataFile:
    """The ``DataFile`` of a chunk with rows, stats from the index entry: its key cut by
    ``unit``, its partition value in ``spec`` (whose time unit is ``unit`` or coarser)."""
    key = DataKey(
        cluster,
        chunk.topic,
        chunk.partition,
        chunk_bucket(chunk, unit),
        chunk.start_offset,
        chunk.end_offset,
        namespace,
        unit,
    ).key
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


def _chunk_state(chunk: ChunkEntry) -> list[Any]:
    bounds = {}
    if chunk.row_count:  # a chunk without rows (aborted or control records only) has none
        bounds = {name: [int(v) for v in chunk.bounds[name]] for name in _BOUND_TYPES}
    return [chunk.partition, chunk.start_offset, chunk.end_offset, chunk.row_count,
            chunk.size_bytes, bounds]  # fmt: skip


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def snapshot_id_of(topic: str, chunks: Sequence[ChunkEntry], end_offsets: Mapping[int, int]) -> int:
    """Positive int64 hashed from the state: the topic, its chunks and its end offsets."""
    state = [
        topic,
        [_chunk_state(c) for c in sorted(chunks, key=lambda c: (c.partition, c.start_offset))],
        sorted((int(p), int(o)) for p, o in end_offsets.items()),
    ]
    return int(_digest(state)[:16], 16) & _MAX_INT64 or 1


class _ManifestWriter(ManifestWriterV2):
    """A v2 manifest writer whose Avro sync marker is fixed."""

    def __init__(
        self,
        output_file: MemoryOutputFile,
        snapshot_id: int,
        sync: bytes,
        spec: PartitionSpec = PARTITION_SPEC,
        schema: Schema = ROW_SCHEMA,
    ) -> None:
        super().__init__(spec, schema, output_file, snapshot_id, _AVRO_CODEC)
        self._sync = sync

    def new_writer(self) -> AvroOutputFile[ManifestEntry]:
        writer = super().new_writer()
        writer.sync_bytes = self._sync  # before __enter__ writes the header
        return writer


class _ManifestListWriter(ManifestListWriterV2):
    """A v2 manifest list writer whose Avro sync marker is fixed (mirrors the base __enter__)."""

    def __init__(self, output_file: MemoryOutputFile, snapshot_id: int, sync: bytes) -> None:
        super().__init__(output_file, snapshot_id, None, _SEQUENCE_NUMBER, _AVRO_CODEC)
        self._sync = sync

    def __enter__(self) -> ManifestListWriter:
        self._writer = AvroOutputFile[ManifestFile](
            output_file=self._output_file,
            record_schema=MANIFEST_LIST_FILE_SCHEMAS[DEFAULT_READ_VERSION],
            file_schema=MANIFEST_LIST_FILE_SCHEMAS[self._format_version],
            schema_name="manifest_file",
            metadata=self._meta,
        )
        self._writer.sync_bytes = self._sync
        self._writer.__enter__()
        return self


@dataclass(frozen=True)
class BuiltTable:
    """A table's metadata and every metadata file it references, by key."""

    metadata_key: str
    metadata_location: str
    metadata: dict[str, Any]
    files: dict[str, bytes]


@dataclass(frozen=True)
class ManifestGroup:
    """Data files written into one manifest, all of partition spec ``spec``."""

    spec: PartitionSpec
    files: Sequence[DataFile]


@dataclass(frozen=True)
class SnapshotPlan:
    """What one synthesized table holds: a single snapshot (or none) over ``groups``."""

    namespace: str
    topic: str
    snapshot_id: int | None
    timestamp_ms: int
    groups: Sequence[ManifestGroup]
    summary: Mapping[str, str]
    schema: Schema = ROW_SCHEMA
    specs: Sequence[PartitionSpec] = (PARTITION_SPEC,)
    default_spec_id: int = PARTITION_SPEC.spec_id
    sort_order: SortOrder = SORT_ORDER


def _file_state(file: DataFile) -> list[Any]:
    return [file.file_path, file.record_count, file.file_size_in_bytes]


def build_metadata(bucket: str, cluster: str, plan: SnapshotPlan) -> BuiltTable:
    """Metadata JSON, manifest list and manifests of ``plan`` (deterministic: the same plan gives
    byte-identical files). Every manifest entry is ADDED by the one snapshot."""
    files: dict[str, bytes] = {}
    ns, topic = plan.namespace, plan.topic
    snapshots: list[Snapshot] = []
    snapshot_log: list[SnapshotLogEntry] = []
    refs: dict[str, SnapshotRef] = {}
    current = plan.snapshot_id
    if current is not None:
        manifests: list[ManifestFile] = []
        for group in plan.groups:
            if not group.files:
                continue
            state = [current, group.spec.spec_id, [_file_state(f) for f in group.files]]
            key = ManifestKey(cluster, topic, _digest(state)[:32], ns).key
            output = MemoryOutputFile(uri(bucket, key))
            with _ManifestWriter(output, current, sync_marker(key), group.spec, plan.schema) as w:
                for file in group.files:
                    w.add(
                        ManifestEntry.from_args(
                            status=ManifestEntryStatus.ADDED,
                            snapshot_id=current,
                            sequence_number=None,
                            file_sequence_number=None,
                            data_file=file,
                        )
                    )
            manifests.append(w.to_manifest_file())
            files[key] = output.getvalue()
        list_key = ManifestListKey(
            cluster, topic, current, _digest([m.manifest_path for m in manifests])[:32], ns
        ).key
        list_output = MemoryOutputFile(uri(bucket, list_key))
        with _ManifestListWriter(list_output, current, sync_marker(list_key)) as list_writer:
            list_writer.add_manifests(manifests)
        files[list_key] = list_output.getvalue()
        all_files = [f for g in plan.groups for f in g.files]
        rows = sum(f.record_count for f in all_files)
        size = sum(f.file_size_in_bytes for f in all_files)
        summary = Summary(
            Operation.APPEND,
            **{
                "added-data-files": str(len(all_files)),
                "added-records": str(rows),
                "added-files-size": str(size),
                "total-data-files": str(len(all_files)),
                "total-records": str(rows),
                "total-files-size": str(size),
                "total-delete-files": "0",
                "total-position-deletes": "0",
                "total-equality-deletes": "0",
                **plan.summary,
            },
        )
        snapshots.append(
            Snapshot(
                snapshot_id=current,
                parent_snapshot_id=None,
                sequence_number=_SEQUENCE_NUMBER,
                timestamp_ms=plan.timestamp_ms,
                manifest_list=uri(bucket, list_key),
                summary=summary,
                schema_id=plan.schema.schema_id,
            )
        )
        snapshot_log.append(SnapshotLogEntry(snapshot_id=current, timestamp_ms=plan.timestamp_ms))
        refs["main"] = SnapshotRef(snapshot_id=current, snapshot_ref_type=SnapshotRefType.BRANCH)
    metadata = TableMetadataV2(
        location=table_location(bucket, cluster, topic, ns),
        table_uuid=uuid.uuid5(_UUID_NAMESPACE, f"{cluster}/{ns}/{topic}"),
        last_updated_ms=plan.timestamp_ms,
        last_column_id=plan.schema.highest_field_id,
        schemas=[plan.schema],
        current_schema_id=plan.schema.schema_id,
        partition_specs=list(plan.specs),
        default_spec_id=plan.default_spec_id,
        last_partition_id=max(
            [field.field_id for spec in plan.specs for field in spec.fields] or [999]
        ),
        properties={},
        current_snapshot_id=current,
        snapshots=snapshots,
        snapshot_log=snapshot_log,
        metadata_log=[],
        sort_orders=[plan.sort_order],
        default_sort_order_id=plan.sort_order.order_id,
        refs=refs,
        last_sequence_number=_SEQUENCE_NUMBER if current else 0,
    )
    text = metadata.model_dump_json(by_alias=True, exclude_none=True)
    metadata_key = MetadataKey(cluster, topic, current or 0, ns).key
    files[metadata_key] = text.encode()
    return BuiltTable(
        metadata_key=metadata_key,
        metadata_location=uri(bucket, metadata_key),
        metadata=json.loads(text),
        files=files,
    )


def hotset_groups(
    bucket: str,
    cluster: str,
    chunks: Sequence[ChunkEntry],
    namespace: str = HOTSET,
    unit: str = DAY,
    spec: PartitionSpec | None = None,
) -> list[ManifestGroup]:
    """One manifest group per Kafka partition over the chunks with rows, in offset order (data
    keys under ``namespace``: hotset, or merged for its aliases; chunks cut by ``unit``; partition
    values in ``spec``, by default the hotset's spec for ``unit``)."""
    spec = spec or spec_for(unit)
    with_rows = sorted(
        (c for c in chunks if c.row_count), key=lambda c: (c.partition, c.start_offset)
    )
    return [
        ManifestGroup(
            spec,
            [
                data_file(bucket, cluster, c, namespace, unit, spec)
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


def build_table(
    bucket: str,
    cluster: str,
    topic: str,
    chunks: Sequence[ChunkEntry],
    end_offsets: Mapping[int, int],
    unit: str = DAY,
) -> BuiltTable:
    """Metadata of the hotset table of ``topic``: one snapshot listing every chunk with rows (one
    manifest per Kafka partition), or no snapshot when no chunk has rows. ``end_offsets`` (next
    offset per partition the chunks cover, e.g. the last stable offsets) enter the snapshot id
    and the summary; chunks are cut and partitioned by ``unit`` (day or hour)."""
    with_rows = any(c.row_count for c in chunks)
    plan = SnapshotPlan(
        namespace=HOTSET,
        topic=topic,
        snapshot_id=snapshot_id_of(topic, chunks, end_offsets) if with_rows else None,
        timestamp_ms=chunks_timestamp_ms(chunks),
        groups=hotset_groups(bucket, cluster, chunks, HOTSET, unit),
        summary={HOTSET_OFFSETS_PROPERTY: format_boundary(end_offsets)},
        specs=(spec_for(unit),),
    )
    return build_metadata(bucket, cluster, plan)
