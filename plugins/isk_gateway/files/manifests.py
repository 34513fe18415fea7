"""Iceberg v2 manifests and manifest lists (Avro), written in memory and deterministic.

A manifest lists the data files of one :class:`ManifestGroup` (one partition spec): ADDED by the
snapshot that writes it, or EXISTING with the snapshot and sequence number that added them (their
*origins*, from the table's history); its key hashes what it lists. A manifest list names a
snapshot's manifests; its key hashes their paths. Avro sync markers come from the file's key
(:func:`.digests.sync_marker`), so the same input gives byte-identical files.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyiceberg.avro.file import AvroOutputFile
from pyiceberg.manifest import (
    DEFAULT_READ_VERSION,
    MANIFEST_LIST_FILE_SCHEMAS,
    DataFile,
    ManifestContent,
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

#: The sequence number of a synthesized table's first snapshot.
SEQUENCE_NUMBER = 1
_AVRO_CODEC = "null"


@dataclass(frozen=True)
class ManifestGroup:
    """Files written into one manifest, all of partition spec ``spec``: data files, or (with
    ``content`` DELETES) position delete files."""

    spec: PartitionSpec
    files: Sequence[DataFile]
    content: ManifestContent = ManifestContent.DATA


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


class _DeleteManifestWriter(_ManifestWriter):
    """A v2 manifest writer of delete files (``content`` deletes), sync marker fixed."""

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


class _ManifestListWriter(ManifestListWriterV2):
    """A v2 manifest list writer whose Avro sync marker is fixed (mirrors the base __enter__)."""

    def __init__(
        self,
        output_file: MemoryOutputFile,
        snapshot_id: int,
        sync: bytes,
        parent_snapshot_id: int | None = None,
        sequence_number: int = SEQUENCE_NUMBER,
    ) -> None:
        super().__init__(output_file, snapshot_id, parent_snapshot_id, sequence_number, _AVRO_CODEC)
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
    origins: Mapping[str, tuple[int, int]] | None = None,
) -> tuple[WrittenFile, ManifestFile]:
    """The manifest of ``group``, and its entry for the manifest list. A file whose path is in
    ``origins`` is EXISTING, added by the snapshot id and sequence number given there; every
    other file is ADDED by ``snapshot_id``."""
    origins = origins or {}
    state = [
        snapshot_id,
        group.spec.spec_id,
        [_file_state(f) + list(origins.get(f.file_path, ())) for f in group.files],
    ]
    if group.content != ManifestContent.DATA:
        state.append(int(group.content))
    key = ManifestKey(cluster, topic, state_digest(state)[:32], namespace).key
    output = MemoryOutputFile(uri(bucket, key))
    deletes = group.content != ManifestContent.DATA
    writer_class = _DeleteManifestWriter if deletes else _ManifestWriter
    with writer_class(output, snapshot_id, sync_marker(key), group.spec, schema) as writer:
        for file in group.files:
            origin = origins.get(file.file_path)
            if origin is None:
                entry = ManifestEntry.from_args(
                    status=ManifestEntryStatus.ADDED,
                    snapshot_id=snapshot_id,
                    sequence_number=None,
                    file_sequence_number=None,
                    data_file=file,
                )
            else:
                entry = ManifestEntry.from_args(
                    status=ManifestEntryStatus.EXISTING,
                    snapshot_id=origin[0],
                    sequence_number=origin[1],
                    file_sequence_number=origin[1],
                    data_file=file,
                )
            writer.add_entry(entry)
    return WrittenFile(key, output.getvalue()), writer.to_manifest_file()


def write_manifest_list(
    bucket: str,
    cluster: str,
    namespace: str,
    topic: str,
    snapshot_id: int,
    manifests: Sequence[ManifestFile],
    parent_snapshot_id: int | None = None,
    sequence_number: int = SEQUENCE_NUMBER,
) -> WrittenFile:
    """The manifest list of snapshot ``snapshot_id`` (child of ``parent_snapshot_id``, with
    ``sequence_number``) naming ``manifests``."""
    chain = [] if parent_snapshot_id is None else [parent_snapshot_id, sequence_number]
    digest = state_digest([m.manifest_path for m in manifests] + chain)[:32]
    key = ManifestListKey(cluster, topic, snapshot_id, digest, namespace).key
    output = MemoryOutputFile(uri(bucket, key))
    sync = sync_marker(key)
    with _ManifestListWriter(
        output, snapshot_id, sync, parent_snapshot_id, sequence_number
    ) as writer:
        writer.add_manifests(list(manifests))
    return WrittenFile(key, output.getvalue())
