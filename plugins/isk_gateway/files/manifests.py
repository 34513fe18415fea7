"""Iceberg v2 manifests and manifest lists (Avro), written in memory and deterministic.

A manifest lists the data files of one :class:`ManifestGroup` (one partition spec), each ADDED
by the table's one snapshot; its key hashes what it lists. A manifest list names a snapshot's
manifests; its key hashes their paths. Avro sync markers come from the file's key
(:func:`.digests.sync_marker`), so the same input gives byte-identical files.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyiceberg.avro.file import AvroOutputFile
from pyiceberg.manifest import (
    DEFAULT_READ_VERSION,
    MANIFEST_LIST_FILE_SCHEMAS,
    DataFile,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestListWriter,
    ManifestListWriterV2,
    ManifestWriterV2,
)
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema

from bergstream.core.api import PARTITION_SPEC, ROW_SCHEMA
from bergstream.plugins.isk_gateway.files.digests import state_digest, sync_marker
from bergstream.plugins.isk_gateway.files.fileio import MemoryOutputFile
from bergstream.plugins.isk_gateway.tables.paths import ManifestKey, ManifestListKey, uri

__all__ = [
    "SEQUENCE_NUMBER",
    "ManifestGroup",
    "WrittenFile",
    "write_manifest",
    "write_manifest_list",
]

#: The sequence number of the one snapshot of every synthesized table.
SEQUENCE_NUMBER = 1
_AVRO_CODEC = "null"


@dataclass(frozen=True)
class ManifestGroup:
    """Data files written into one manifest, all of partition spec ``spec``."""

    spec: PartitionSpec
    files: Sequence[DataFile]


@dataclass(frozen=True)
class WrittenFile:
    """A metadata file written in memory: its key and its bytes."""

    key: str
    data: bytes


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
        super().__init__(output_file, snapshot_id, None, SEQUENCE_NUMBER, _AVRO_CODEC)
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


def _file_state(file: DataFile) -> list[Any]:
    return [file.file_path, file.record_count, file.file_size_in_bytes]


def write_manifest(
    bucket: str,
    cluster: str,
    namespace: str,
    topic: str,
    snapshot_id: int,
    group: ManifestGroup,
    schema: Schema = ROW_SCHEMA,
) -> tuple[WrittenFile, ManifestFile]:
    """The manifest of ``group`` (every entry ADDED by ``snapshot_id``), and its entry for the
    manifest list."""
    state = [snapshot_id, group.spec.spec_id, [_file_state(f) for f in group.files]]
    key = ManifestKey(cluster, topic, state_digest(state)[:32], namespace).key
    output = MemoryOutputFile(uri(bucket, key))
    with _ManifestWriter(output, snapshot_id, sync_marker(key), group.spec, schema) as writer:
        for file in group.files:
            writer.add(
                ManifestEntry.from_args(
                    status=ManifestEntryStatus.ADDED,
                    snapshot_id=snapshot_id,
                    sequence_number=None,
                    file_sequence_number=None,
                    data_file=file,
                )
            )
    return WrittenFile(key, output.getvalue()), writer.to_manifest_file()


def write_manifest_list(
    bucket: str,
    cluster: str,
    namespace: str,
    topic: str,
    snapshot_id: int,
    manifests: Sequence[ManifestFile],
) -> WrittenFile:
    """The manifest list of snapshot ``snapshot_id`` naming ``manifests``."""
    digest = state_digest([m.manifest_path for m in manifests])[:32]
    key = ManifestListKey(cluster, topic, snapshot_id, digest, namespace).key
    output = MemoryOutputFile(uri(bucket, key))
    with _ManifestListWriter(output, snapshot_id, sync_marker(key)) as writer:
        writer.add_manifests(list(manifests))
    return WrittenFile(key, output.getvalue())
