"""Helpers of the typed-table property test (:mod:`tests.pipeline.test_typed_property`).

Many independently generated Avro schemas go through one topic and one pipeline run: each
generated schema (:func:`tests.kits.avro_gen.avro_schemas`) becomes one field of a
wrapping record (:func:`wrapper_schema`), its named types renamed with a per-example prefix so no
two examples clash. Each example draws its own values, the last :data:`LIBERAL` of them also
written with the liberties Avro allows (:class:`tests.kits.avro_noncanonical.LiberalWriter`);
record ``r`` of the topic holds value ``r`` of every example. Around those records: records that
do not decode (no framing, unknown schema id, truncated, trailing bytes) and tombstones
(:func:`plan_records`).

Values are compared at the normalized level of :mod:`tests.kits.avro_gen`: fastavro's
decoding of the canonical bytes (:func:`expected_values`) against the Arrow values of PyIceberg
(``from_arrow``, through :func:`as_pyiceberg`), of the data files read with pyarrow and of Spark
(:func:`from_spark`).
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import fastavro
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from pyiceberg.schema import Schema
from pyiceberg.table import Table

from bergstream.core.api import RegisteredSchema, ResolvedLake, TopicCodecsResolver
from bergstream.core.typed.row_contract import RowRecord
from bergstream.core.typed.typed_rows import NO_FRAMING
from bergstream.pipeline.settings import PipelineLake
from bergstream.pipeline.stream import run_pipeline
from bergstream.plugins.cache_backends.local_disk import LocalDiskCache
from bergstream.plugins.index_backends.sqlite_index import SqliteIndex
from bergstream.plugins.isk_gateway.kafka.reader import KafkaReader
from bergstream.plugins.isk_gateway.tables.hotset import HotsetProvider
from bergstream.plugins.isk_gateway.tables.lake_schemas import LakeSchemas
from bergstream.plugins.isk_gateway.tables.layouts import TopicLayouts
from bergstream.plugins.value_codecs.avro.schema import PRIMITIVES, AvroNode, parse_avro
from bergstream.plugins.value_codecs.avro.types import branch_names, is_null, union_parts
from tests.kits.avro_gen import avro_schemas, from_fastavro, values_of
from tests.kits.avro_noncanonical import LiberalWriter
from tests.kits.avro_registry import codecs_settings, typed_context
from tests.kits.avro_wire import framed
from tests.kits.hotset_reader import open_table
from tests.kits.ksi_stack import Seen, start_ksi_proxy
from tests.kits.lake import Produced, consume_all, produce
from tests.pipeline.typed_kit import (
    coldset,
    decoder_of,
    sorted_rows,
    truth_table,
    typing_for,
)

#: A function drawing with hypothesis' ``data()`` (see :func:`generation_only`).
Drawing = Callable[[st.DataObject], None]

#: Values per example produced with confluent-kafka's AvroSerializer.
CANONICAL = 6
#: Values per example also written by the liberal writer (after the canonical ones).
LIBERAL = 4
#: Kafka timestamp of record 0.
FIRST_MS = 1_714_564_800_000
#: A schema id the registry does not have.
UNKNOWN_ID = 2_147_480_000

#: A hand-made example with every feature the generator draws (so one run covers them all,
#: whatever the generated ones are): every primitive, every logical type, both decimal forms,
#: a null field, nested records, arrays, maps, enums, fixed, nullable unions in both orders,
#: general unions (with named, array and map branches), defaults and a named type used twice.
ALL_FEATURES: dict[str, Any] = {
    "type": "record", "name": "Everything", "namespace": "feature.test",
    "fields": [
        {"name": "flag", "type": "boolean", "default": True},
        {"name": "small", "type": "int", "default": 0},
        {"name": "big", "type": "long", "default": 7},
        {"name": "ratio", "type": "float"},
        {"name": "rate", "type": "double", "default": 1.5},
        {"name": "blob", "type": "bytes"},
        {"name": "text", "type": "string", "default": "x"},
        {"name": "nothing", "type": "null"},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "t_ms", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "t_us", "type": {"type": "long", "logicalType": "time-micros"}},
        {"name": "ts_ms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "ts_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "lts_ms", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
        {"name": "lts_us", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
        {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "dec_b", "type": {"type": "bytes", "logicalType": "decimal", "precision": 38,
                                   "scale": 9}},
        {"name": "dec_f", "type": {"type": "fixed", "name": "Money", "size": 16,
                                   "logicalType": "decimal", "precision": 38, "scale": 2}},
        {"name": "inner", "type": {"type": "record", "name": "Inner", "fields": [
            {"name": "x", "type": "int"},
            {"name": "tags", "type": {"type": "array", "items": "string"}},
            {"name": "deep", "type": {"type": "map", "values": {
                "type": "array", "items": ["null", {"type": "record", "name": "Leaf", "fields": [
                    {"name": "v", "type": ["long", "null"], "default": 3}]}]}}},
        ]}},
        {"name": "items", "type": {"type": "array", "items": "Leaf"}},
        {"name": "counts", "type": {"type": "map", "values": ["null", "long"]}},
        {"name": "color", "type": {"type": "enum", "name": "Color",
                                   "symbols": ["RED", "GREEN", "BLUE"]}, "default": "RED"},
        {"name": "four", "type": {"type": "fixed", "name": "Four", "size": 4}},
        {"name": "maybe", "type": ["null", "string"], "default": None},
        {"name": "maybe_too", "type": ["double", "null"], "default": 0.5},
        {"name": "either", "type": ["null", "int", "string", "Inner"], "default": None},
        {"name": "any", "type": [{"type": "array", "items": "long"},
                                 {"type": "map", "values": "string"}, "Color", "Four",
                                 "boolean", "float",
                                 {"type": "int", "logicalType": "date"}]},
        {"name": "inner_again", "type": "Inner"},
    ],
}  # fmt: skip


@dataclass(frozen=True)
class Example:
    """One drawn example: the wrapper field it becomes, its schema (named types renamed), its
    values in fastavro's writer form and the liberal encodings of the last :data:`LIBERAL`."""

    field: str
    schema: Any
    values: list[Any]
    liberal: list[bytes]


def renamed(schema: Any, prefix: str) -> Any:
    """``schema`` with ``prefix`` put before the name of every named type (definitions and
    references, namespaces kept)."""
    if isinstance(schema, str):
        if schema in PRIMITIVES:
            return schema
        space, dot, name = schema.rpartition(".")
        return f"{space}{dot}{prefix}{name}"
    if isinstance(schema, list):
        return [renamed(branch, prefix) for branch in schema]
    out = dict(schema)
    kind = out["type"]
    if kind in ("record", "enum", "fixed"):
        out["name"] = prefix + out["name"]
        if kind == "record":
            out["fields"] = [{**f, "type": renamed(f["type"], prefix)} for f in out["fields"]]
    elif kind == "array":
        out["items"] = renamed(out["items"], prefix)
    elif kind == "map":
        out["values"] = renamed(out["values"], prefix)
    elif not isinstance(kind, str) or kind not in PRIMITIVES:
        out["type"] = renamed(kind, prefix)
    return out


def parse(schema: Any) -> AvroNode:
    """The codec's tree of a JSON-ready schema."""
    return parse_avro(RegisteredSchema(0, "AVRO", json.dumps(schema)))


def generation_only(count: int, seed: int) -> Callable[[Drawing], Callable[[], None]]:
    """A decorator running ``body`` on ``count`` examples hypothesis draws from ``seed``,
    generation only (nothing to shrink or replay: the checks run later over all the draws)."""

    def wrap(body: Drawing) -> Callable[[], None]:
        run: Callable[[], None] = hypothesis_seed(seed)(
            settings(
                max_examples=count,
                database=None,
                deadline=None,
                phases=[Phase.generate],
                suppress_health_check=list(HealthCheck),
            )(given(st.data())(body))
        )
        return run

    return wrap


def draw_examples(count: int, seed: int, *, start: int = 0, schema: Any = None) -> list[Example]:
    """``count`` examples drawn by hypothesis (one hypothesis example each, generation only:
    nothing to shrink, the checks run later over all of them), fields ``p{start}`` on; each a
    generated schema, or ``schema`` when given."""
    drawn: list[Example] = []

    @generation_only(count, seed)
    def collect(data: st.DataObject) -> None:
        index = start + len(drawn)
        source = schema if schema is not None else data.draw(avro_schemas(), label="schema")
        example = renamed(source, f"P{index}_")
        node = parse(example)
        total = CANONICAL + LIBERAL
        values = data.draw(st.lists(values_of(node), min_size=total, max_size=total))
        liberal = []
        for value in values[CANONICAL:]:
            writer = LiberalWriter(data.draw)
            writer.write(node, value)
            liberal.append(bytes(writer.out))
        drawn.append(Example(f"p{index}", example, values, liberal))

    collect()
    return drawn


def wrapper_schema(examples: list[Example]) -> dict[str, Any]:
    """The topic's value schema: one field per example (no namespace, so every example's names
    resolve as they did alone)."""
    fields = [{"name": e.field, "type": e.schema} for e in examples]
    return {"type": "record", "name": "PropertyValue", "fields": fields}


def wrapper_value(examples: list[Example], number: int) -> dict[str, Any]:
    """Value ``number`` of every example, as one wrapper record."""
    return {e.field: e.values[number] for e in examples}


def canonical_payload(schema: dict[str, Any], value: Any) -> bytes:
    """fastavro's encoding (the canonical one, no framing)."""
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), value)
    return out.getvalue()


def expected_values(schema: dict[str, Any], node: AvroNode, payload: bytes) -> dict[str, Any]:
    """What a decoder must make of a canonical payload, normalized: fastavro's reading."""
    parsed = fastavro.parse_schema(schema)
    value = fastavro.schemaless_reader(io.BytesIO(payload), parsed, None, return_named_type=True)
    normalized: dict[str, Any] = from_fastavro(node, value)
    return normalized


def from_spark(node: AvroNode, value: Any) -> Any:
    """A value of Spark's ``toArrow().to_pylist()`` in the normalized form: as PyIceberg's, but
    uuids are strings (Iceberg's Spark type for uuid) and timestamps in the session's zone."""
    if value is None:
        return None
    if node.kind == "union":
        branches, _ = union_parts(node)
        if len(branches) == 1:
            return from_spark(branches[0], value)
        names = branch_names(branches)
        return {n: from_spark(b, value[n]) for n, b in zip(names, branches, strict=True)}
    if node.logical == "uuid":
        return uuid.UUID(value) if isinstance(value, str) else value
    if node.kind == "record":
        return {
            name: from_spark(child, value[name])
            for name, child in node.fields
            if not is_null(child)
        }
    if node.kind == "array":
        return [from_spark(node.items, v) for v in value]  # type: ignore[arg-type]
    if node.kind == "map":
        return {k: from_spark(node.items, v) for k, v in value}  # type: ignore[arg-type]
    return value


# -- the records of the topic --------------------------------------------------------------


@dataclass(frozen=True)
class Planned:
    """One record to produce and what its row must hold. ``kind``: ``canonical`` (by the
    AvroSerializer), ``liberal``, ``tombstone`` or a kind of undecodable value; ``cause``: the
    expected ``kafka_value_error`` (a prefix for ``corrupt payload``)."""

    number: int
    kind: str
    value: bytes | None
    values: dict[str, Any] | None = None
    payload: bytes | None = None  # the canonical payload of ``values``
    schema_id: int | None = None
    cause: str | None = None

    @property
    def key(self) -> bytes | None:
        """Keys stay raw: text, null or empty."""
        return {3: None, 4: b""}.get(self.number % 5, f"k{self.number}".encode())

    @property
    def headers(self) -> tuple[tuple[str, bytes | None], ...]:
        """Headers naming the record (``n``), with a duplicate key and a null value."""
        return (("n", str(self.number).encode()), ("dup", b"1"), ("dup", None))

    @property
    def timestamp(self) -> int:
        """CreateTime of the record."""
        return FIRST_MS + self.number


def plan_records(
    examples: list[Example], schema_id: int, serialize: Any
) -> tuple[list[Planned], dict[str, Any]]:
    """The topic's records (canonical ones serialized by ``serialize``, an AvroSerializer),
    and the wrapper schema."""
    schema = wrapper_schema(examples)
    planned: list[Planned] = []

    def add(kind: str, value: bytes | None, **fields: Any) -> None:
        planned.append(Planned(len(planned), kind, value, **fields))

    for number in range(CANONICAL):
        values = wrapper_value(examples, number)
        payload = canonical_payload(schema, values)
        add("canonical", serialize(values), values=values, payload=payload, schema_id=schema_id)
    for number in range(LIBERAL):
        values = wrapper_value(examples, CANONICAL + number)
        liberal = b"".join(e.liberal[number] for e in examples)
        payload = canonical_payload(schema, values)
        add("liberal", framed(schema_id, liberal), values=values, payload=payload,
            schema_id=schema_id)  # fmt: skip
    body = planned[0].payload
    assert body is not None
    add("tombstone", None)
    add("unframed", b"plain text, no framing", cause=NO_FRAMING)
    add("empty", b"", cause=NO_FRAMING)
    add("short", b"\x00\x00\x00", cause=NO_FRAMING)
    add("unknown id", framed(UNKNOWN_ID, body), schema_id=UNKNOWN_ID,
        cause=f"unknown schema id {UNKNOWN_ID}")  # fmt: skip
    add("truncated", framed(schema_id, body[:-1]), schema_id=schema_id, cause="corrupt payload")
    add("only framing", framed(schema_id, b""), schema_id=schema_id, cause="corrupt payload")
    add("trailing", framed(schema_id, body + b"\x00"), schema_id=schema_id,
        cause="trailing bytes after the record")  # fmt: skip
    add("tombstone", None)
    return planned, schema


def kept_bytes(record: Planned) -> bytes | None:
    """What ``kafka_value`` must hold: the original bytes unless the typed columns give them
    back (a tombstone or a canonical value)."""
    if record.value is None:
        return None
    if record.cause is not None:
        return record.value
    assert record.payload is not None and record.schema_id is not None
    return None if record.value == framed(record.schema_id, record.payload) else record.value


# -- ISK, KSI and Kafka --------------------------------------------------------------------


def hotset_rows(
    home: Path, bootstrap: str, registry_url: str, topic: str, lake: ResolvedLake
) -> tuple[Schema, list[dict[str, Any]]]:
    """ISK's ``hotset.<topic>`` (layout based on the coldset's schema, as the gateway does):
    its Iceberg schema, and the rows of the data files it serves (the bytes an engine
    downloads, read with pyarrow) by (partition, offset)."""
    return asyncio.run(_hotset_rows(home, bootstrap, registry_url, topic, lake))


async def _hotset_rows(
    home: Path, bootstrap: str, registry_url: str, topic: str, lake: ResolvedLake
) -> tuple[Schema, list[dict[str, Any]]]:
    return await _hotset_rows_of_codecs(
        home, bootstrap, codecs_settings(registry_url, topic), topic, lake
    )


def hotset_rows_of_codecs(
    home: Path, bootstrap: str, codecs: dict[str, Any], topic: str, lake: ResolvedLake
) -> tuple[Schema, list[dict[str, Any]]]:
    """:func:`hotset_rows` for a ``codecs:`` section given as it is (e.g. a ``json`` rule and
    no registry)."""
    return asyncio.run(_hotset_rows_of_codecs(home, bootstrap, codecs, topic, lake))


async def _hotset_rows_of_codecs(
    home: Path, bootstrap: str, codecs: dict[str, Any], topic: str, lake: ResolvedLake
) -> tuple[Schema, list[dict[str, Any]]]:
    layouts = TopicLayouts(TopicCodecsResolver(typed_context(home, codecs)), LakeSchemas(lake))
    async with KafkaReader(bootstrap) as reader:
        provider = HotsetProvider(
            reader,
            SqliteIndex(home / f"isk-index-{topic}.db"),
            LocalDiskCache(home / f"isk-cache-{topic}", 1 << 28),
            bucket="gw",
            cluster="c1",
            chunk_records=7,
            layouts=layouts,
        )
        loaded = await provider.load_table("hotset", topic)
        schema = open_table(provider, loaded, asyncio.get_running_loop()).schema()
        rows: list[dict[str, Any]] = []
        for key, _ in await provider.list_keys(f"c1/hotset/{topic}/data/", 10_000):
            data = bytes(await provider.read_file(key))
            rows += pq.read_table(pa.BufferReader(data)).to_pylist()
        return schema, by_position(rows)


def coldset_file_rows(table: Table) -> list[dict[str, Any]]:
    """The rows of the coldset's data files read with pyarrow (not through PyIceberg's
    projection, see :func:`as_pyiceberg`), by (partition, offset)."""
    rows: list[dict[str, Any]] = []
    for task in table.scan().plan_files():
        location = urlsplit(task.file.file_path)  # file:/... (Spark) or file:///... (PyIceberg)
        assert location.scheme == "file", task.file.file_path
        rows += pq.read_table(location.path).to_pylist()
    return by_position(rows)


def by_position(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows sorted by (partition, offset)."""
    return sorted(rows, key=lambda r: (r["kafka_partition"], r["kafka_offset"]))


def by_position_seen(records: list[Any]) -> list[tuple[Any, ...]]:
    """Records as KSI's reader returns them, by (partition, offset)."""
    return sorted(
        (r.partition, r.record.offset, r.record.timestamp, r.record.key, r.record.value,
         tuple(r.record.headers))
        for r in records
    )  # fmt: skip


def as_pyiceberg(node: AvroNode, value: Any) -> Any:
    """A normalized value as PyIceberg 0.12 reads it back: a null list of structs reads as an
    empty list and a null map with struct values as an empty map, because its Arrow projection
    rebuilds them from their offsets without their validity (apache/iceberg-python#3833, open;
    the files are right: Spark and pyarrow read the nulls). Everything else is unchanged."""
    if node.kind == "union":
        branches, _ = union_parts(node)
        if len(branches) == 1:
            return as_pyiceberg(branches[0], value)
        if value is None:
            return None
        names = branch_names(branches)
        return {n: as_pyiceberg(b, value[n]) for n, b in zip(names, branches, strict=True)}
    if node.kind in ("array", "map") and value is None:
        assert node.items is not None
        if not _struct_like(node.items):
            return None
        return [] if node.kind == "array" else {}
    if value is None:
        return None
    if node.kind == "record":
        return {
            name: as_pyiceberg(child, value[name])
            for name, child in node.fields
            if not is_null(child)
        }
    if node.kind == "array":
        return [as_pyiceberg(node.items, v) for v in value]  # type: ignore[arg-type]
    if node.kind == "map":
        return {k: as_pyiceberg(node.items, v) for k, v in value.items()}  # type: ignore[arg-type]
    return value


def _struct_like(node: AvroNode) -> bool:
    """Whether values of ``node`` are an Arrow struct (a record or a general union)."""
    if node.kind == "record":
        return True
    if node.kind == "union":
        branches, _ = union_parts(node)
        return len(branches) > 1 or (len(branches) == 1 and _struct_like(branches[0]))
    return False


def ksi_config(lake: ResolvedLake, registry_url: str, topic: str) -> str:
    """The ``lake:`` and ``codecs:`` sections (JSON is YAML) for the KSI proxy: the same
    catalog as ``lake``, values of ``topic`` typed by the registry."""
    return lake_and_codecs_yaml(lake, {"url": registry_url}, topic)


def lake_and_codecs_yaml(lake: ResolvedLake, registry: dict[str, Any], topic: str) -> str:
    """The ``lake:`` section of ``lake`` and a ``codecs:`` section typing the values of
    ``topic`` by the registry ``registry`` (its settings) says, as YAML (JSON is YAML)."""
    codecs = {"schema_registry": registry, "topics": [{"match": topic, "value": "registry"}]}
    return lake_yaml(lake, codecs)


def lake_yaml(lake: ResolvedLake, codecs: dict[str, Any]) -> str:
    """The ``lake:`` section of ``lake`` and the ``codecs:`` section ``codecs``, as YAML (JSON
    is YAML)."""
    sections = {
        "lake": {
            "kafka_bootstrap": lake.config.kafka_bootstrap,
            "namespace": lake.namespace,
            "catalog": {
                "type": lake.catalog_type,
                "name": lake.catalog_name,
                "uri": lake.catalog_uri,
                "warehouse": lake.warehouse,
            },
        },
        "codecs": codecs,
    }
    return "".join(f"\n{name}: {json.dumps(body)}\n" for name, body in sections.items())


def delete_everything(bootstrap: str, topic: str, ends: dict[int, int]) -> None:
    """Kafka's DeleteRecords up to each partition's end: the topic keeps no record."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.delete_records([TopicPartition(topic, p, end) for p, end in ends.items()])
    for partition, future in futures.items():
        result = future.result(timeout=60)
        assert result.low_watermark == ends[partition.partition], (partition, result)


def read_all(bootstrap: str, topic: str, partitions: int, count: int) -> list[Seen]:
    """Every record of ``topic`` from the log start, with aiokafka (which keeps header keys
    byte for byte), as :data:`Seen` tuples."""
    return asyncio.run(_read_all(bootstrap, topic, partitions, count))


async def _read_all(bootstrap: str, topic: str, partitions: int, count: int) -> list[Seen]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        assigned = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(assigned)
        await consumer.seek_to_beginning(*assigned)
        got: list[Seen] = []
        deadline = time.monotonic() + 120
        while len(got) < count and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=1000)
            for messages in batches.values():
                got.extend(
                    (m.partition, m.offset, m.timestamp, m.key, m.value, tuple(m.headers))
                    for m in messages
                )
        return sorted(got)
    finally:
        await consumer.stop()


# -- steps shared by the property tests of every format ------------------------------------


def property_seed() -> int:
    """The seed of a property test's draw: ``BERGSTREAM_PROPERTY_SEED``, ``random`` for a new
    draw; a fixed default keeps CI reproducible."""
    setting = os.environ.get("BERGSTREAM_PROPERTY_SEED") or "20261124"
    return random.randrange(2**32) if setting == "random" else int(setting)


def property_examples(least: int = 0) -> int:
    """How many examples a property test draws: ``BERGSTREAM_PROPERTY_EXAMPLES`` (60 by
    default), at least ``least`` when it is given."""
    count = int(os.environ.get("BERGSTREAM_PROPERTY_EXAMPLES", "60"))
    return max(least, count) if least else count


@dataclass(frozen=True)
class TypedRun:
    """A topic after one typed pipeline run: the coldset table, its rows as PyIceberg reads
    them and as core's decoder makes them of the records Kafka holds, by (partition, offset)."""

    table: Table
    by_pyiceberg: list[dict[str, Any]]
    by_decoder: list[dict[str, Any]]


def produce_and_run(
    spark: Any,
    lake: PipelineLake,
    bootstrap: str,
    registry_url: str,
    topic: str,
    home: Path,
    values: list[bytes | None],
    partitions: int,
    note: str = "",
) -> TypedRun:
    """Produces ``values`` (record ``n``: partition ``n % partitions``, key ``k<n>``, one header
    ``n``: ``<n>``, timestamp ``FIRST_MS + n``), runs the pipeline once over ``topic`` typed by
    the registry and reads the result (``note`` goes into the failure message)."""
    produce(bootstrap, topic, [
        Produced(n % partitions, b"k%d" % n, value, (("n", b"%d" % n),), FIRST_MS + n)
        for n, value in enumerate(values)
    ])  # fmt: skip
    typing = typing_for(home, registry_url, topic)
    result = run_pipeline(spark, lake, topic, once=True, report=lambda line: None, codecs=typing)
    assert result.records == len(values), note
    table = coldset(lake, topic)
    by_pyiceberg = sorted_rows(table.scan().to_arrow())
    truth = truth_table(bootstrap, topic, partitions)
    by_decoder = sorted_rows(decoder_of(typing).decode(truth).table)
    return TypedRun(table, by_pyiceberg, by_decoder)


def spark_rows(spark: Any, name: str) -> list[dict[str, Any]]:
    """The table read by Spark into Arrow (session time zone UTC while reading, so timestamps
    of any year convert), by partition then offset."""
    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    try:
        rows = spark.table(name).toArrow().to_pylist()
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)
    return by_position(rows)


def assert_hotset_is_coldset(
    home: Path, bootstrap: str, registry_url: str, topic: str, lake: ResolvedLake, table: Table,
    note: str = "",
) -> None:  # fmt: skip
    """ISK's ``hotset.<topic>`` has the coldset's schema and its files hold the coldset files'
    rows (``note`` goes into the failure message)."""
    hot_schema, by_hotset = hotset_rows(home, bootstrap, registry_url, topic, lake)
    assert hot_schema.as_struct() == table.schema().as_struct()
    assert by_hotset == coldset_file_rows(table), note


def seen_of(kept: RowRecord) -> Seen:
    """A record read from Kafka as clients see it."""
    record = kept.record
    return (kept.partition, record.offset, record.timestamp, record.key, record.value,
            tuple(record.headers))  # fmt: skip


def delete_records_of(bootstrap: str, topic: str, records: list[RowRecord]) -> None:
    """DeleteRecords of every record of ``records`` (each partition's up to its last one)."""
    ends: dict[int, int] = {}
    for r in records:
        ends[r.partition] = max(ends.get(r.partition, 0), r.record.offset + 1)
    delete_everything(bootstrap, topic, ends)


def take_all_records(bootstrap: str, topic: str, partitions: int) -> list[Seen]:
    """Every record of ``topic`` as Kafka held it (:data:`Seen`, sorted), then DeleteRecords
    of all of them."""
    records = consume_all(bootstrap, topic, partitions)
    delete_records_of(bootstrap, topic, records)
    return sorted(seen_of(r) for r in records)


def read_through_ksi(
    home: Path, bootstrap: str, topic: str, config: str, partitions: int, count: int
) -> tuple[list[Seen], str]:
    """Every record (``count`` of them expected) a KSI proxy over ``bootstrap`` serves of
    ``topic`` (``config``: its ``lake:`` and ``codecs:`` sections, see :func:`ksi_config`), and
    the proxy's log."""
    proxy = start_ksi_proxy(home, bootstrap, [topic], config)
    try:
        got = read_all(proxy.bootstrap, topic, partitions, count)
    finally:
        proxy.stop()
    return got, proxy.log()


def ksi_after_delete(
    home: Path, bootstrap: str, lake: ResolvedLake, registry_url: str, topic: str, partitions: int
) -> tuple[list[Seen], list[Seen], str]:
    """Every record of ``topic`` as Kafka held it, then DeleteRecords of all of them
    (:func:`take_all_records`), then what a KSI proxy typing values by the registry serves
    (:func:`read_through_ksi`): ``(served, held, the proxy's log)``."""
    held = take_all_records(bootstrap, topic, partitions)
    config = ksi_config(lake, registry_url, topic)
    served, log = read_through_ksi(home, bootstrap, topic, config, partitions, len(held))
    return served, held, log
