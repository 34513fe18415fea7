"""The hotset of a topic of plain JSON values (the ``json`` codec: no framing, no registry, no
lake) on the real broker: LoadTable shows the columns the records make, a record with a new key
adds a column at the next LoadTable (ids of the others unchanged), PyIceberg reads the rows, a
value that is not a JSON object keeps its bytes with the cause, a load after new records reads
only those from Kafka for the layout, and a gateway that never served the table (a restart)
rebuilds a data file from its key alone."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bergstream.core.api import (
    ROW_SCHEMA,
    SCHEMA_PROPERTY_PREFIX,
    VALUE_ERROR_COLUMN,
    VALUE_SCHEMA_ID_COLUMN,
    TopicCodecsResolver,
)
from bergstream.plugins.cache_backends.local_disk import LocalDiskCache
from bergstream.plugins.index_backends.sqlite_index import SqliteIndex
from bergstream.plugins.isk_gateway.files.hotset_parquet import HotsetDataSynthesizer
from bergstream.plugins.isk_gateway.kafka.reader import FetchedRange, KafkaReader, PartitionOffsets
from bergstream.plugins.isk_gateway.tables.hotset import HotsetProvider
from bergstream.plugins.isk_gateway.tables.layouts import TopicLayouts
from bergstream.plugins.isk_gateway.tables.paths import DataKey, parse_key
from tests.kits.avro_registry import BASE_MS, typed_context
from tests.kits.hotset_reader import scan_rows
from tests.kits.isk_gateway import produce

pytestmark = pytest.mark.slow

CURRENCIES = ("EUR", "USD", "CHF")
NOT_AN_OBJECT = b"[1,2]"
NOT_JSON = b'{"id":'


def compact(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def order(i: int, note: bool = False) -> dict[str, Any]:
    value: dict[str, Any] = {"id": i, "currency": CURRENCIES[i % 3], "amount": i * 1.5 + 0.25}
    if note:
        value["note"] = f"order {i} ✓"
    return value


def layouts_for(tmp_path: Path, topic: str) -> TopicLayouts:
    context = typed_context(tmp_path, {"topics": [{"match": topic, "value": "json"}]})
    return TopicLayouts(TopicCodecsResolver(context))


def produce_values(bootstrap: str, topic: str, values: list[bytes], first: int) -> None:
    produce(bootstrap, topic, [
        {"partition": n % 2, "key": b"k%d" % n, "value": v, "timestamp": BASE_MS + n}
        for n, v in enumerate(values, first)
    ])  # fmt: skip


class CountingSource:
    """A Kafka source that records the ranges fetched through it."""

    def __init__(self, reader: KafkaReader) -> None:
        self.reader = reader
        self.fetched: list[tuple[int, int, int]] = []

    async def offsets(self, topic: str) -> dict[int, PartitionOffsets]:
        return await self.reader.offsets(topic)

    async def fetch(self, topic: str, partition: int, start: int, end: int) -> FetchedRange:
        self.fetched.append((partition, start, end))
        return await self.reader.fetch(topic, partition, start, end)


def columns_of(metadata: dict[str, Any]) -> dict[str, tuple[int, Any]]:
    schema = next(s for s in metadata["schemas"] if s["schema-id"] == metadata["current-schema-id"])
    return {f["name"]: (f["id"], f["type"]) for f in schema["fields"]}


async def test_a_json_topic_is_served_with_inferred_columns(
    kafka_bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = new_topic(partitions=2, prefix="plain-json")
    first = [compact(order(i)) for i in range(20)] + [NOT_AN_OBJECT, NOT_JSON, b'{"id": 3}']
    produce_values(kafka_bootstrap, topic, first, 0)
    layouts = layouts_for(tmp_path, topic)
    async with KafkaReader(kafka_bootstrap) as reader:
        provider = HotsetProvider(
            reader,
            SqliteIndex(tmp_path / "index.db"),
            LocalDiskCache(tmp_path / "cache", 1 << 28),
            bucket="gw",
            cluster="c1",
            chunk_records=7,
            layouts=layouts,
        )
        loaded = await provider.load_table("hotset", topic)
        columns = columns_of(loaded.metadata)
        names = list(columns)
        assert names == [
            *(f.name for f in ROW_SCHEMA.fields),
            VALUE_SCHEMA_ID_COLUMN,
            VALUE_ERROR_COLUMN,
            "id",
            "currency",
            "amount",
        ]
        assert [columns[c][1] for c in ("id", "currency", "amount")] == ["long", "string", "double"]
        shapes = [k for k in loaded.metadata["properties"] if k.startswith(SCHEMA_PROPERTY_PREFIX)]
        assert len(shapes) == 2  # {id, currency, amount} and {id}: KSI re-encodes with them

        rows = await scan_rows(provider, loaded)
        assert len(rows) == len(first)
        by_value = {bytes(r["kafka_value"]): r for r in rows if r["kafka_value"] is not None}
        not_an_object = by_value[NOT_AN_OBJECT]
        assert not_an_object[VALUE_ERROR_COLUMN] == "value: not a JSON object but an array"
        assert by_value[NOT_JSON][VALUE_ERROR_COLUMN].startswith("corrupt payload")
        assert not_an_object[VALUE_SCHEMA_ID_COLUMN] is None
        spaced = by_value[b'{"id": 3}']  # decoded, bytes kept: not the canonical text
        assert spaced[VALUE_ERROR_COLUMN] is None and spaced["id"] == 3
        decoded = [r for r in rows if r["kafka_value"] is None]
        assert sorted((r["id"], r["currency"], r["amount"]) for r in decoded) == [
            (v["id"], v["currency"], v["amount"]) for v in map(order, range(20))
        ]
        assert all(r[VALUE_SCHEMA_ID_COLUMN] is not None for r in decoded)

        # records with a new key: the next LoadTable has its column, the others keep their ids
        second = [compact(order(i, note=True)) for i in range(23, 29)]
        produce_values(kafka_bootstrap, topic, second, len(first))
        loaded = await provider.load_table("hotset", topic)
        evolved = columns_of(loaded.metadata)
        assert {n: evolved[n] for n in names} == columns
        assert list(evolved)[-1] == "note" and evolved["note"][1] == "string"
        assert evolved["note"][0] > max(i for i, _ in columns.values())
        rows = await scan_rows(provider, loaded)
        assert len(rows) == len(first) + len(second)
        notes = sorted((r["id"], r["note"]) for r in rows if r["note"] is not None)
        assert notes == [(i, f"order {i} ✓") for i in range(23, 29)]
        assert all(r["kafka_value"] is None for r in rows if r["note"] is not None)

        # the layout's telling values of offsets read before are kept: only new ones are read
        counting = CountingSource(reader)
        layouts.source = counting
        produce_values(kafka_bootstrap, topic, [compact(order(i)) for i in range(30, 34)], 29)
        typed = await layouts.resolve(topic)
        key = next(k for k, _ in await provider.list_keys(f"c1/hotset/{topic}/data/", 100))
        data_key = parse_key(key)
        assert isinstance(data_key, DataKey)
        assert typed is not None and typed.digest == data_key.layout  # no new shape: same layout
        ends = {p: o.last_stable for p, o in (await reader.offsets(topic)).items()}
        assert sorted(counting.fetched) == [(0, ends[0] - 2, ends[0]), (1, ends[1] - 2, ends[1])]
        layouts.source = reader

        # a gateway that never served the table (a restart) rebuilds a data file from its key
        keys = [k for k, _ in await provider.list_keys(f"c1/hotset/{topic}/data/", 100)]
        fresh = HotsetDataSynthesizer(reader, "c1", layouts=layouts_for(tmp_path, topic))
        for key in keys:
            assert bytes(await fresh.synthesize(key)) == bytes(await provider.read_file(key))
