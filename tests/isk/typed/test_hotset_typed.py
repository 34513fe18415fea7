"""The hotset of an Avro topic on the real broker and the stack's Schema Registry: typed columns
equal to the produced values, undecodable records kept with their cause, deterministic files, a
new schema version evolving the table, and a registry outage as a retriable error, never a file.
Read with PyIceberg through ``provider.read_file``."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from bergstream.core.api import (
    ROW_SCHEMA,
    SCHEMA_PROPERTY_PREFIX,
    VALUE_ERROR_COLUMN,
    VALUE_SCHEMA_ID_COLUMN,
    TopicCodecsResolver,
    TypedRows,
)
from bergstream.plugins.cache_backends.local_disk import LocalDiskCache
from bergstream.plugins.index_backends.sqlite_index import SqliteIndex
from bergstream.plugins.isk_gateway.files.batch_decoder import decode_batches
from bergstream.plugins.isk_gateway.files.hotset_parquet import HotsetDataSynthesizer
from bergstream.plugins.isk_gateway.kafka.reader import KafkaReader
from bergstream.plugins.isk_gateway.tables.hotset import HotsetProvider
from bergstream.plugins.isk_gateway.tables.layouts import TopicLayouts
from bergstream.plugins.isk_gateway.tables.paths import DataKey, parse_key
from bergstream.plugins.isk_gateway.tables.provider import NoSuchFile, ProviderUnavailable
from tests.kits.avro_registry import (
    BASE_MS,
    PAYMENT_V1,
    PAYMENT_V2,
    closed_registry_url,
    codecs_settings,
    payment,
    produce_avro,
    typed_context,
)
from tests.kits.hotset_reader import scan_rows
from tests.kits.isk_gateway import produce

pytestmark = pytest.mark.slow

FIELDS = ["id", "currency", "amount", "at", "note", "tags"]
NO_FRAMING = b"plain bytes, no framing"
UNKNOWN_ID = b"\x00\x7f\xff\xff\x00" + b"\x02"


@pytest.fixture(scope="module")
def registry_url(stack_env: dict[str, str]) -> str:
    return stack_env["BERGSTREAM_SCHEMA_REGISTRY_URL"]


def layouts_for(tmp_path: Path, registry_url: str, match: str) -> TopicLayouts:
    context = typed_context(tmp_path, codecs_settings(registry_url, match))
    return TopicLayouts(TopicCodecsResolver(context))


def provider_for(
    reader: KafkaReader, tmp_path: Path, name: str, layouts: TopicLayouts
) -> HotsetProvider:
    return HotsetProvider(
        reader,
        SqliteIndex(tmp_path / f"{name}.db"),
        LocalDiskCache(tmp_path / f"{name}-cache", 1 << 28),
        bucket="gw",
        cluster="c1",
        chunk_records=7,
        layouts=layouts,
    )


def produce_payments(bootstrap: str, registry_url: str, topic: str) -> tuple[int, list[dict]]:
    """20 payments on each of 2 partitions, then records that do not decode and a tombstone
    on partition 0; returns the schema id and the values by (partition, order)."""
    values = [(i % 2, payment(i)) for i in range(40)]
    schema_id = produce_avro(bootstrap, registry_url, topic, PAYMENT_V1, values)
    corrupt = b"\x00" + schema_id.to_bytes(4, "big") + b"\x02"  # cut after the first field
    produce(
        bootstrap,
        topic,
        [
            {"partition": 0, "value": v, "timestamp": BASE_MS + 100 + n}
            for n, v in enumerate([NO_FRAMING, UNKNOWN_ID, corrupt, None])
        ],
    )
    return schema_id, [v for _, v in values]


def typed_value(row: dict[str, Any]) -> dict[str, Any]:
    return {name: row[name] for name in FIELDS}


async def test_an_avro_topic_reads_as_typed_columns(
    kafka_bootstrap: str, registry_url: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = new_topic(partitions=2, prefix="payments")
    schema_id, values = produce_payments(kafka_bootstrap, registry_url, topic)
    layouts = layouts_for(tmp_path, registry_url, topic)
    async with KafkaReader(kafka_bootstrap) as reader:
        provider = provider_for(reader, tmp_path, "a", layouts)
        loaded = await provider.load_table("hotset", topic)
        metadata = loaded.metadata
        schema = metadata["schemas"][0]
        names = [f["name"] for f in schema["fields"]]
        assert names == [
            *(f.name for f in ROW_SCHEMA.fields),
            VALUE_SCHEMA_ID_COLUMN,
            VALUE_ERROR_COLUMN,
            *FIELDS,
        ]
        by_name = {f["name"]: f for f in schema["fields"]}
        assert by_name["amount"]["type"] == "double"
        assert by_name["at"]["type"] == "timestamptz"
        assert metadata["last-column-id"] >= by_name["tags"]["id"]
        stored = json.loads(metadata["properties"][f"{SCHEMA_PROPERTY_PREFIX}{schema_id}"])
        assert stored["schemaType"] == "AVRO"
        assert json.loads(stored["schema"])["name"] == "Payment"

        rows = await scan_rows(provider, loaded)
        assert len(rows) == 44
        decoded = [r for r in rows if r[VALUE_ERROR_COLUMN] is None and r["kafka_value"] is None]
        decoded = [r for r in decoded if r[VALUE_SCHEMA_ID_COLUMN] is not None]
        assert sorted((typed_value(r) for r in decoded), key=lambda v: v["id"]) == values
        assert {r[VALUE_SCHEMA_ID_COLUMN] for r in decoded} == {schema_id}
        assert all(r["kafka_key"] is not None for r in decoded)  # keys stay raw bytes

        bad = {bytes(r["kafka_value"]): r for r in rows if r[VALUE_ERROR_COLUMN] is not None}
        assert bad[NO_FRAMING][VALUE_ERROR_COLUMN] == "no Confluent framing"
        assert bad[NO_FRAMING][VALUE_SCHEMA_ID_COLUMN] is None
        assert bad[UNKNOWN_ID][VALUE_ERROR_COLUMN] == f"unknown schema id {0x7FFFFF00}"
        corrupt = next(v for v in bad if v not in (NO_FRAMING, UNKNOWN_ID))
        assert bad[corrupt][VALUE_SCHEMA_ID_COLUMN] == schema_id
        assert all(bad[v]["amount"] is None for v in bad)
        tombstones = [r for r in rows if r["kafka_value"] is None and r[VALUE_ERROR_COLUMN] is None]
        tombstones = [r for r in tombstones if r[VALUE_SCHEMA_ID_COLUMN] is None]
        assert len(tombstones) == 1 and tombstones[0]["amount"] is None

        # the same state gives the same metadata; every data key names the layout
        assert loaded == await provider.load_table("hotset", topic)
        keys = [k for k, _ in await provider.list_keys(f"c1/hotset/{topic}/data/", 1000)]
        assert keys and all("/data/layout=" in k for k in keys)
        digests = {parse_key(k).layout for k in keys}  # type: ignore[union-attr]
        assert len(digests) == 1

        # a data file rebuilt from its key alone by a fresh synthesizer: the same bytes
        fresh = HotsetDataSynthesizer(
            reader, "c1", layouts=layouts_for(tmp_path, registry_url, topic)
        )
        for key in keys:
            assert bytes(await fresh.synthesize(key)) == bytes(await provider.read_file(key))


async def test_a_raw_topic_is_served_as_before(
    kafka_bootstrap: str, registry_url: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = new_topic(partitions=1)
    produce(kafka_bootstrap, topic, [{"partition": 0, "value": b"v%d" % i} for i in range(10)])
    async with KafkaReader(kafka_bootstrap) as reader:
        typed = provider_for(reader, tmp_path, "typed", layouts_for(tmp_path, registry_url, "x-*"))
        plain = HotsetProvider(
            reader,
            SqliteIndex(tmp_path / "plain.db"),
            LocalDiskCache(tmp_path / "plain-cache", 1 << 28),
            bucket="gw",
            cluster="c1",
            chunk_records=7,
        )
        with_rule = await typed.load_table("hotset", topic)
        without = await plain.load_table("hotset", topic)
        assert with_rule == without  # same keys, schema, snapshot id: byte-identical metadata
        keys = [k for k, _ in await typed.list_keys(f"c1/hotset/{topic}/data/", 100)]
        assert keys and not any("layout=" in k for k in keys)
        for key in keys:
            assert bytes(await typed.read_file(key)) == bytes(await plain.read_file(key))


async def test_a_new_schema_version_evolves_the_table(
    kafka_bootstrap: str, registry_url: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = new_topic(partitions=1)
    produce_avro(
        kafka_bootstrap, registry_url, topic, PAYMENT_V1, [(0, payment(i)) for i in range(9)]
    )
    layouts = layouts_for(tmp_path, registry_url, topic)
    async with KafkaReader(kafka_bootstrap) as reader:
        provider = provider_for(reader, tmp_path, "evolve", layouts)
        first = await provider.load_table("hotset", topic)
        first_ids = {f["name"]: f["id"] for f in first.metadata["schemas"][0]["fields"]}
        assert "country" not in first_ids
        old_keys = {k for k, _ in await provider.list_keys(f"c1/hotset/{topic}/data/", 100)}

        v2 = [(0, payment(i, version=2)) for i in range(9, 18)]
        produce_avro(kafka_bootstrap, registry_url, topic, PAYMENT_V2, v2, BASE_MS + 50)
        second = await provider.load_table("hotset", topic)
        fields = second.metadata["schemas"][0]["fields"]
        ids = {f["name"]: f["id"] for f in fields}
        assert {name: ids[name] for name in first_ids} == first_ids  # stable by path
        assert ids["country"] == first.metadata["last-column-id"] + 1
        assert second.metadata["last-column-id"] == ids["country"]
        assert second.metadata_location != first.metadata_location

        rows = await scan_rows(provider, second)
        assert [r["country"] for r in rows[:9]] == [None] * 9
        assert [r["country"] for r in rows[9:]] == [v["country"] for _, v in v2]
        assert [typed_value(r) for r in rows] == [payment(i) for i in range(18)]
        new_keys = {k for k, _ in await provider.list_keys(f"c1/hotset/{topic}/data/", 100)}
        layouts_of = {parse_key(k).layout for k in new_keys}  # type: ignore[union-attr]
        assert len(layouts_of) == 1
        assert layouts_of.isdisjoint({parse_key(k).layout for k in old_keys})  # type: ignore[union-attr]

        # a key of the old layout: still built for a client holding the old metadata (the
        # gateway remembers that layout), refused by a gateway that never knew it
        old_key = sorted(old_keys)[0]
        assert bytes(await provider.files.synthesizers[0].synthesize(old_key))
        forgetful = HotsetDataSynthesizer(
            reader, "c1", layouts=layouts_for(tmp_path, registry_url, topic)
        )
        with pytest.raises(NoSuchFile, match="load the table again"):
            await forgetful.synthesize(old_key)
        assert bytes(await forgetful.synthesize(sorted(new_keys)[0]))


async def test_a_registry_outage_is_retriable_and_builds_nothing(
    kafka_bootstrap: str, registry_url: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = new_topic(partitions=1)
    produce_avro(
        kafka_bootstrap, registry_url, topic, PAYMENT_V1, [(0, payment(i)) for i in range(9)]
    )
    down = closed_registry_url()
    async with KafkaReader(kafka_bootstrap) as reader:
        broken = provider_for(reader, tmp_path, "down", layouts_for(tmp_path, down, topic))
        with pytest.raises(ProviderUnavailable, match="Schema Registry"):
            await broken.load_table("hotset", topic)
        assert await broken.list_keys("c1/", 100) == []

        # a key built while the registry was up is not rebuilt while it is down
        good = provider_for(reader, tmp_path, "up", layouts_for(tmp_path, registry_url, topic))
        await good.load_table("hotset", topic)
        key = next(k for k, _ in await good.list_keys(f"c1/hotset/{topic}/data/", 10))
        assert isinstance(parse_key(key), DataKey)
        synthesizer = HotsetDataSynthesizer(
            reader, "c1", layouts=layouts_for(tmp_path, down, topic)
        )
        with pytest.raises(ProviderUnavailable):
            await synthesizer.synthesize(key)

        # decoding an id outside the layout with the registry down raises, never guesses
        up_layouts = layouts_for(tmp_path, registry_url, topic)
        typed = await up_layouts.resolve(topic)
        assert typed is not None
        from bergstream.core.api import SchemaRegistryClient
        from bergstream.core.typed.schema_registry import SchemaRegistrySettings

        offline = SchemaRegistryClient(SchemaRegistrySettings(url=down, timeout_seconds=2))
        typed.rows = TypedRows(typed.layout, typed.rows.codecs, offline)
        fetched = await reader.fetch(topic, 0, 0, 9)
        rows = decode_batches(fetched.records, 0, 0, 9)
        other_id = b"\x00\x00\x00\x7f\x01" + b"\x02"
        values = pa.array([other_id] * rows.num_rows, pa.large_binary())
        index = rows.schema.get_field_index("kafka_value")
        rows = rows.set_column(index, rows.schema.field(index), values)
        with pytest.raises(ProviderUnavailable):
            typed.decode(rows)
