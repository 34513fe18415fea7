"""build_table: byte-identical output for one state, fixed sync markers, lengths and sizes that
match the bytes, v2 snapshot rules, stats from the index bounds."""

from __future__ import annotations

import json

from pyiceberg.conversions import from_bytes
from pyiceberg.manifest import read_manifest_list
from pyiceberg.types import LongType, TimestamptzType

from bergstream.core.backends import ChunkEntry
from bergstream.core.typed.row_contract import OFFSET_ID, TIMESTAMP_ID
from bergstream.plugins.isk_gateway.files.data_files import chunk_bounds
from bergstream.plugins.isk_gateway.files.digests import sync_marker
from bergstream.plugins.isk_gateway.files.fileio import BytesInputFile
from bergstream.plugins.isk_gateway.files.table_metadata import snapshot_id_of
from bergstream.plugins.isk_gateway.tables.paths import key_from_uri, parse_key
from tests.kits.hotset_reader import build_table

US = 1_700_000_000_000_000


def chunk(partition: int, start: int, end: int, size: int = 1000) -> ChunkEntry:
    return ChunkEntry(
        "orders",
        partition,
        start,
        end,
        end - start,
        size,
        chunk_bounds(partition, (start, end - 1), (US + start, US + end * 1000)),
    )


CHUNKS = [chunk(0, 0, 10), chunk(0, 10, 20, 1500), chunk(2, 5, 8, 700)]
ENDS = {0: 20, 1: 0, 2: 8}


def test_same_state_same_bytes_and_state_changes_the_snapshot() -> None:
    one = build_table("gw", "c1", "orders", CHUNKS, ENDS)
    two = build_table("gw", "c1", "orders", list(reversed(CHUNKS)), dict(ENDS))
    assert one == two
    assert json.loads(one.files[one.metadata_key]) == one.metadata
    other = build_table("gw", "c1", "orders", CHUNKS, {**ENDS, 1: 3})
    assert other.metadata["current-snapshot-id"] != one.metadata["current-snapshot-id"]
    assert snapshot_id_of("orders", CHUNKS, ENDS) == one.metadata["current-snapshot-id"]
    assert 0 < snapshot_id_of("x", [], {}) < 2**63


def test_snapshot_and_manifest_list() -> None:
    built = build_table("gw", "c1", "orders", CHUNKS, ENDS)
    metadata = built.metadata
    snapshot_id = metadata["current-snapshot-id"]
    assert metadata["format-version"] == 2 and metadata["last-sequence-number"] == 1
    assert metadata["refs"]["main"]["snapshot-id"] == snapshot_id
    assert metadata["last-column-id"] == 10 and metadata["last-partition-id"] == 1001
    (snapshot,) = metadata["snapshots"]
    assert snapshot["sequence-number"] == 1 and "parent-snapshot-id" not in snapshot
    assert snapshot["timestamp-ms"] == (US + 20_000) // 1000
    assert snapshot["summary"]["bergstream.hotset-offsets"] == '{"0":20,"1":0,"2":8}'
    list_key = key_from_uri("gw", snapshot["manifest-list"])
    assert parse_key(list_key).snapshot_id == snapshot_id
    data = built.files[list_key]
    assert data[-16:] == sync_marker(list_key)  # the marker closes every block
    manifests = list(read_manifest_list(BytesInputFile(snapshot["manifest-list"], data)))
    assert len(manifests) == 2  # one per Kafka partition with rows
    for manifest in manifests:
        key = key_from_uri("gw", manifest.manifest_path)
        assert manifest.manifest_length == len(built.files[key])
        assert built.files[key][-16:] == sync_marker(key)
        assert manifest.sequence_number == manifest.min_sequence_number == 1
        assert manifest.added_snapshot_id == snapshot_id


def test_data_files_carry_index_stats() -> None:
    built = build_table("gw", "c1", "orders", CHUNKS, ENDS)
    snapshot = built.metadata["snapshots"][0]
    list_key = key_from_uri("gw", snapshot["manifest-list"])
    manifests = list(read_manifest_list(BytesInputFile("l", built.files[list_key])))
    files = {}
    for manifest in manifests:
        key = key_from_uri("gw", manifest.manifest_path)

        class IO:
            @staticmethod
            def new_input(location: str, key: str = key) -> BytesInputFile:
                return BytesInputFile(location, built.files[key])

        for entry in manifest.fetch_manifest_entry(IO()):
            assert entry.snapshot_id == snapshot["snapshot-id"] and entry.sequence_number == 1
            files[entry.data_file.file_path] = entry.data_file
    assert len(files) == 3
    first = files["s3://gw/c1/hotset/orders/data/p=0/day=2023-11-14/10-20.parquet"]
    assert first.record_count == 10 and first.file_size_in_bytes == 1500
    assert first.partition[0] == 0 and first.partition[1] == US // 86_400_000_000
    assert from_bytes(LongType(), first.lower_bounds[OFFSET_ID]) == 10
    assert from_bytes(LongType(), first.upper_bounds[OFFSET_ID]) == 19
    assert from_bytes(TimestamptzType(), first.upper_bounds[TIMESTAMP_ID]) == US + 20_000


def test_chunks_without_rows_count_in_the_state_but_list_no_file() -> None:
    empty = ChunkEntry("orders", 1, 0, 4, 0, 0, {})
    built = build_table("gw", "c1", "orders", [*CHUNKS, empty], ENDS)
    assert built.metadata["snapshots"][0]["summary"]["total-data-files"] == "3"
    base = build_table("gw", "c1", "orders", CHUNKS, ENDS).metadata["current-snapshot-id"]
    assert built.metadata["current-snapshot-id"] != base


def test_empty_chunks_give_no_snapshot() -> None:
    built = build_table("gw", "c1", "orders", [ChunkEntry("orders", 0, 0, 5, 0, 0, {})], {0: 5})
    assert "current-snapshot-id" not in built.metadata
    assert list(built.files) == [built.metadata_key]
    assert built.metadata_key.endswith("/0-00000000-0000-0000-0000-000000000000.metadata.json")
