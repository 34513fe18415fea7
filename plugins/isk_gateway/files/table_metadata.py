"""Deterministic table metadata of one synthesized table: its manifests, manifest list, snapshot
and ``TableMetadataV2``, from a :class:`SnapshotPlan`.

The same plan gives byte-identical files: a hotset snapshot id is a hash of the state (positive
int64, :func:`snapshot_id_of`), Avro sync markers are derived from each file's key instead of
``os.urandom`` (:mod:`.manifests`), timestamps come from the data, and every key names its content
(see :mod:`..tables.paths`). :func:`build_metadata` composes the steps: manifests, manifest list,
snapshot, metadata; :func:`plan_table` plans a hotset table from its chunks
(:mod:`.data_files`).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pyiceberg.manifest import ManifestContent, ManifestFile
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.metadata import TableMetadataV2
from pyiceberg.table.refs import SnapshotRef, SnapshotRefType
from pyiceberg.table.snapshots import Operation, Snapshot, SnapshotLogEntry, Summary
from pyiceberg.table.sorting import SortOrder

from bergstream.core.api import PARTITION_SPEC, ROW_SCHEMA, SORT_ORDER, ChunkEntry, format_boundary
from bergstream.plugins.isk_gateway.files.data_files import (
    BOUND_COLUMNS,
    chunks_timestamp_ms,
    hotset_groups,
    spec_for,
)
from bergstream.plugins.isk_gateway.files.digests import state_digest
from bergstream.plugins.isk_gateway.files.manifests import (
    SEQUENCE_NUMBER,
    ManifestGroup,
    WrittenFile,
    write_manifest,
    write_manifest_list,
)
from bergstream.plugins.isk_gateway.tables.paths import (
    DAY,
    HOTSET,
    MetadataKey,
    table_location,
    uri,
)

__all__ = [
    "HOTSET_OFFSETS_PROPERTY",
    "BuiltTable",
    "SnapshotPlan",
    "TableShape",
    "build_metadata",
    "plan_table",
    "snapshot_id_of",
]

#: Snapshot summary key: next offset per partition the hotset snapshot covers, as JSON.
HOTSET_OFFSETS_PROPERTY = "bergstream.hotset-offsets"

_MAX_INT64 = 2**63 - 1
_UUID_NAMESPACE = uuid.UUID("8f0e3c52-5d2e-4b8a-9a43-62a1c0d7b0f1")


@dataclass(frozen=True)
class BuiltTable:
    """A table's metadata and every metadata file it references, by key."""

    metadata_key: str
    metadata_location: str
    metadata: dict[str, Any]
    files: dict[str, bytes]


class TableShape(Protocol):
    """What a typed table's metadata takes from its layout (:class:`.typed_topic.TypedTopic`)."""

    @property
    def digest(self) -> str:
        """The layout's digest, in data keys and snapshot ids."""
        ...

    @property
    def schema(self) -> Schema:
        """The table schema: contract columns, then typed columns."""
        ...

    @property
    def last_column_id(self) -> int:
        """The table's last column id."""
        ...

    @property
    def properties(self) -> Mapping[str, str]:
        """Table properties (``bergstream.schema.<id>`` of every schema of the layout)."""
        ...


@dataclass(frozen=True)
class SnapshotPlan:
    """What one synthesized table holds: its current snapshot (or none) over ``groups``, after
    the older snapshots of its history (``history``, oldest first, their manifest lists written
    when each was current)."""

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
    #: Table properties (e.g. ``bergstream.schema.<id>`` of a typed table), written sorted.
    properties: Mapping[str, str] = field(default_factory=dict)
    #: The table's last column id (None: the schema's highest field id); a typed layout's may
    #: be higher, ids of dropped columns are never given again.
    last_column_id: int | None = None
    #: The current snapshot's place in the history: its parent, its sequence number, what it
    #: did, and the files it carries over from earlier snapshots (path -> (the snapshot id and
    #: sequence number that added it)); every other file is ADDED by it.
    parent_snapshot_id: int | None = None
    sequence_number: int = SEQUENCE_NUMBER
    operation: Operation = Operation.APPEND
    origins: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    #: Older snapshots of the table, oldest first (their ids give the metadata key's version).
    history: Sequence[Snapshot] = ()


def _chunk_state(chunk: ChunkEntry) -> list[Any]:
    bounds = {}
    if chunk.row_count:  # a chunk without rows (aborted or control records only) has none
        bounds = {name: [int(v) for v in chunk.bounds[name]] for name in BOUND_COLUMNS}
    return [chunk.partition, chunk.start_offset, chunk.end_offset, chunk.row_count,
            chunk.size_bytes, bounds]  # fmt: skip


def snapshot_id_of(topic: str, chunks: Sequence[ChunkEntry], end_offsets: Mapping[int, int]) -> int:
    """Positive int64 hashed from the state: the topic, its chunks and its end offsets."""
    state = [
        topic,
        [_chunk_state(c) for c in sorted(chunks, key=lambda c: (c.partition, c.start_offset))],
        sorted((int(p), int(o)) for p, o in end_offsets.items()),
    ]
    return int(state_digest(state)[:16], 16) & _MAX_INT64 or 1


def _manifests(
    bucket: str, cluster: str, plan: SnapshotPlan, snapshot_id: int
) -> tuple[list[WrittenFile], list[ManifestFile]]:
    """One manifest per group with files, and their entries for the manifest list."""
    written: list[WrittenFile] = []
    manifests: list[ManifestFile] = []
    for group in plan.groups:
        if not group.files:
            continue
        file, manifest = write_manifest(
            bucket, cluster, plan.namespace, plan.topic, snapshot_id, group, plan.schema,
            plan.origins,
        )  # fmt: skip
        written.append(file)
        manifests.append(manifest)
    return written, manifests


def _snapshot(plan: SnapshotPlan, snapshot_id: int, manifest_list: str) -> Snapshot:
    """The plan's current snapshot: the files its groups list, those not carried over from
    earlier snapshots added by it, with the plan's summary properties."""
    all_files = [f for g in plan.groups if g.content == ManifestContent.DATA for f in g.files]
    deletes = [f for g in plan.groups if g.content != ManifestContent.DATA for f in g.files]
    added = [f for f in all_files if f.file_path not in plan.origins]
    added_deletes = [f for f in deletes if f.file_path not in plan.origins]
    rows = sum(f.record_count for f in all_files)
    size = sum(f.file_size_in_bytes for f in [*all_files, *deletes])
    more: dict[str, str] = {}
    if added_deletes:
        more = {
            "added-delete-files": str(len(added_deletes)),
            "added-position-delete-files": str(len(added_deletes)),
            "added-position-deletes": str(sum(f.record_count for f in added_deletes)),
        }
    summary = Summary(
        plan.operation,
        **{
            "added-data-files": str(len(added)),
            "added-records": str(sum(f.record_count for f in added)),
            "added-files-size": str(sum(f.file_size_in_bytes for f in [*added, *added_deletes])),
            **more,
            "total-data-files": str(len(all_files)),
            "total-records": str(rows),
            "total-files-size": str(size),
            "total-delete-files": str(len(deletes)),
            "total-position-deletes": str(sum(f.record_count for f in deletes)),
            "total-equality-deletes": "0",
            **plan.summary,
        },
    )
    return Snapshot(
        snapshot_id=snapshot_id,
        parent_snapshot_id=plan.parent_snapshot_id,
        sequence_number=plan.sequence_number,
        timestamp_ms=plan.timestamp_ms,
        manifest_list=manifest_list,
        summary=summary,
        schema_id=plan.schema.schema_id,
    )


def _table_metadata(
    bucket: str, cluster: str, plan: SnapshotPlan, snapshot: Snapshot | None
) -> TableMetadataV2:
    """The table's metadata: its schema, specs and sort order, its older snapshots, and
    ``snapshot`` as the current snapshot of ``main`` (none: an empty table)."""
    ns, topic = plan.namespace, plan.topic
    snapshots: list[Snapshot] = list(plan.history)
    snapshot_log = [
        SnapshotLogEntry(snapshot_id=s.snapshot_id, timestamp_ms=s.timestamp_ms)
        for s in plan.history
    ]
    refs: dict[str, SnapshotRef] = {}
    if snapshot is not None:
        snapshots.append(snapshot)
        snapshot_log.append(
            SnapshotLogEntry(snapshot_id=snapshot.snapshot_id, timestamp_ms=plan.timestamp_ms)
        )
        refs["main"] = SnapshotRef(
            snapshot_id=snapshot.snapshot_id, snapshot_ref_type=SnapshotRefType.BRANCH
        )
    return TableMetadataV2(
        location=table_location(bucket, cluster, topic, ns),
        table_uuid=uuid.uuid5(_UUID_NAMESPACE, f"{cluster}/{ns}/{topic}"),
        last_updated_ms=plan.timestamp_ms,
        last_column_id=max(plan.last_column_id or 0, plan.schema.highest_field_id),
        schemas=[plan.schema],
        current_schema_id=plan.schema.schema_id,
        partition_specs=list(plan.specs),
        default_spec_id=plan.default_spec_id,
        last_partition_id=max(
            [field.field_id for spec in plan.specs for field in spec.fields] or [999]
        ),
        properties=dict(sorted(plan.properties.items())),
        current_snapshot_id=plan.snapshot_id,
        snapshots=snapshots,
        snapshot_log=snapshot_log,
        metadata_log=[],
        sort_orders=[plan.sort_order],
        default_sort_order_id=plan.sort_order.order_id,
        refs=refs,
        last_sequence_number=plan.sequence_number if plan.snapshot_id else 0,
    )


def build_metadata(bucket: str, cluster: str, plan: SnapshotPlan) -> BuiltTable:
    """Metadata JSON, manifest list and manifests of ``plan`` (deterministic: the same plan gives
    byte-identical files). Every manifest entry is ADDED by the one snapshot."""
    files: dict[str, bytes] = {}
    snapshot: Snapshot | None = None
    if plan.snapshot_id is not None:
        written, manifests = _manifests(bucket, cluster, plan, plan.snapshot_id)
        manifest_list = write_manifest_list(
            bucket, cluster, plan.namespace, plan.topic, plan.snapshot_id, manifests,
            plan.parent_snapshot_id, plan.sequence_number,
        )  # fmt: skip
        for file in [*written, manifest_list]:
            files[file.key] = file.data
        snapshot = _snapshot(plan, plan.snapshot_id, uri(bucket, manifest_list.key))
    text = _table_metadata(bucket, cluster, plan, snapshot).model_dump_json(
        by_alias=True, exclude_none=True
    )
    version = state_digest([s.snapshot_id for s in plan.history])[:16] if plan.history else ""
    metadata_key = MetadataKey(
        cluster,
        plan.topic,
        plan.snapshot_id or 0,
        plan.namespace,
        version,
        plan.sequence_number if plan.snapshot_id else 0,
    ).key
    files[metadata_key] = text.encode()
    return BuiltTable(
        metadata_key=metadata_key,
        metadata_location=uri(bucket, metadata_key),
        metadata=json.loads(text),
        files=files,
    )


def plan_table(
    bucket: str,
    cluster: str,
    topic: str,
    chunks: Sequence[ChunkEntry],
    end_offsets: Mapping[int, int],
    unit: str = DAY,
    typed: TableShape | None = None,
) -> SnapshotPlan:
    """The plan of the hotset table of ``topic``: one snapshot listing every chunk with rows (one
    manifest per Kafka partition), or no snapshot when no chunk has rows. ``end_offsets`` (next
    offset per partition the chunks cover, e.g. the last stable offsets) enter the snapshot id
    and the summary; chunks are cut and partitioned by ``unit`` (day or hour). ``typed``: the
    typed layout the chunks' files are decoded into (None: a raw topic, the row contract); its
    digest enters the snapshot id and the data keys."""
    with_rows = any(c.row_count for c in chunks)
    layout = typed.digest if typed is not None else None
    state_topic = topic if layout is None else f"{topic}\x00{layout}"
    return SnapshotPlan(
        namespace=HOTSET,
        topic=topic,
        snapshot_id=snapshot_id_of(state_topic, chunks, end_offsets) if with_rows else None,
        timestamp_ms=chunks_timestamp_ms(chunks),
        groups=hotset_groups(bucket, cluster, chunks, HOTSET, unit, layout=layout),
        summary={HOTSET_OFFSETS_PROPERTY: format_boundary(end_offsets)},
        specs=(spec_for(unit),),
        schema=typed.schema if typed is not None else ROW_SCHEMA,
        last_column_id=typed.last_column_id if typed is not None else None,
        properties=typed.properties if typed is not None else {},
    )
