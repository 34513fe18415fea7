"""Keys and metadata of typed hotset tables, without Kafka or a registry: data keys name the
layout's digest (strictly parsed), a raw topic's keys and metadata are as before, and a typed
table's metadata carries the layout's schema, last column id and ``bergstream.schema.<id>``
properties, deterministically."""

from __future__ import annotations

import json

import pytest
from pyiceberg.manifest import DataFile
from pyiceberg.table.metadata import TableMetadataV2

from bergstream.core.api import (
    ROW_SCHEMA,
    SCHEMA_PROPERTY_PREFIX,
    ChunkEntry,
    RegisteredSchema,
    SideCodecs,
    StoredSchemas,
    TopicCodecs,
    TypedRows,
    build_layout,
)
from bergstream.plugins.isk_gateway.files.data_files import chunk_bounds, chunk_key
from bergstream.plugins.isk_gateway.files.fileio import KeyFileIO
from bergstream.plugins.isk_gateway.files.table_metadata import BuiltTable
from bergstream.plugins.isk_gateway.files.typed_topic import TypedTopic, layout_digest
from bergstream.plugins.isk_gateway.tables.paths import DataKey, key_from_uri, parse_key
from bergstream.plugins.isk_gateway.tables.provider import NoSuchFile
from tests.kits.avro_registry import PAYMENT_V1, PAYMENT_V2
from tests.kits.hotset_reader import build_table

DIGEST = "0123456789abcdef0123"
DAY_US = 86_400_000_000


def typed_topic(*versions: dict) -> TypedTopic:
    from bergstream.plugins.value_codecs.avro.codec import AvroCodec

    schemas = [
        RegisteredSchema(40 + n, "AVRO", json.dumps(v), subject="t-value", version=n + 1)
        for n, v in enumerate(versions)
    ]
    codecs = TopicCodecs("t", SideCodecs({"AVRO": AvroCodec()}, "t-value"))
    source = StoredSchemas().add(schemas)
    layout = build_layout(ROW_SCHEMA, ROW_SCHEMA.highest_field_id, codecs, source)
    digest = layout_digest(layout, {"match": "t"})
    return TypedTopic("t", layout, TypedRows(layout, codecs, source), digest)


def data_files(built: BuiltTable) -> list[DataFile]:
    """The data files the built table's snapshot lists, read from its own manifests."""
    io = KeyFileIO("gw", lambda key: built.files[key])
    metadata = TableMetadataV2.model_validate(built.metadata)
    snapshot = metadata.current_snapshot()
    assert snapshot is not None
    return [
        entry.data_file
        for manifest in snapshot.manifests(io)
        for entry in manifest.fetch_manifest_entry(io)
    ]


def chunks() -> list[ChunkEntry]:
    day = 19_800 * DAY_US
    return [
        ChunkEntry("t", 0, 0, 7, 7, 1234, chunk_bounds(0, (0, 6), (day, day + 6))),
        ChunkEntry("t", 0, 7, 9, 2, 999, chunk_bounds(0, (7, 8), (day + 7, day + 8))),
    ]


def test_data_keys_name_the_layout() -> None:
    key = DataKey("c1", "orders", 2, 19_675, 10, 20, layout=DIGEST)
    assert key.key == f"c1/hotset/orders/data/layout={DIGEST}/p=2/day=2023-11-14/10-20.parquet"
    assert parse_key(key.key) == key
    hour = DataKey("c1", "o", 0, 5, 0, 1, "merged", "hour", DIGEST)
    assert parse_key(hour.key) == hour
    raw = DataKey("c1", "orders", 2, 19_675, 10, 20)
    assert raw.key == "c1/hotset/orders/data/p=2/day=2023-11-14/10-20.parquet"


@pytest.mark.parametrize(
    "layout", ["", "0123", DIGEST.upper(), DIGEST + "0", "g" * 20, DIGEST[:-1] + "/"]
)
def test_layout_segments_are_parsed_strictly(layout: str) -> None:
    with pytest.raises(NoSuchFile):
        parse_key(f"c1/hotset/orders/data/layout={layout}/p=2/day=2023-11-14/10-20.parquet")


def test_typed_metadata_carries_the_layout() -> None:
    typed = typed_topic(PAYMENT_V1)
    offsets = {0: 9}
    built = build_table("gw", "c1", "t", chunks(), offsets, typed=typed)
    again = build_table("gw", "c1", "t", chunks(), offsets, typed=typed_topic(PAYMENT_V1))
    assert built == again  # deterministic, from a fresh layout too
    metadata = built.metadata
    names = [f["name"] for f in metadata["schemas"][0]["fields"]]
    assert names[:7] == [f.name for f in ROW_SCHEMA.fields]
    assert "amount" in names and "currency" in names
    assert metadata["last-column-id"] == typed.layout.last_column_id
    assert set(metadata["properties"]) == {f"{SCHEMA_PROPERTY_PREFIX}40"}
    listed = sorted(key_from_uri("gw", f.file_path) for f in data_files(built))
    assert listed == sorted(chunk_key("c1", c, "day", layout=typed.digest).key for c in chunks())
    assert all(f"/data/layout={typed.digest}/" in key for key in listed)

    raw = build_table("gw", "c1", "t", chunks(), offsets)
    assert (
        raw.metadata["schemas"][0]["fields"] == json.loads(ROW_SCHEMA.model_dump_json())["fields"]
    )
    assert raw.metadata["properties"] == {}
    assert raw.metadata_location != built.metadata_location  # other snapshot id


def test_a_new_version_is_a_new_digest_with_stable_ids() -> None:
    first, second = typed_topic(PAYMENT_V1), typed_topic(PAYMENT_V1, PAYMENT_V2)
    assert first.digest != second.digest
    ids = {f.name: f.field_id for f in first.schema.fields}
    later = {f.name: f.field_id for f in second.schema.fields}
    assert {k: later[k] for k in ids} == ids
    assert later["country"] == first.last_column_id + 1
