"""Schema evolution across two and three versions of a JSON Schema topic and of a Protobuf
topic, read through ISK's ``merged`` table with DuckDB, Spark and PyIceberg (the Avro version,
with the registry outage, is :mod:`tests.pipeline.test_typed_evolution`).

Each format has its own topic (one subject), its own gateway and three versions, produced with
confluent-kafka's ``JSONSerializer`` / ``ProtobufSerializer`` against the stack's registry:

- JSON Schema (``integer`` -> long, ``number`` -> double, so no promotion to show): v1 ``id``,
  ``currency``, ``amount``, ``note`` (nullable); v2 adds a nullable ``country`` and an array
  ``tags``; v3 removes ``note`` and adds a nullable ``channel`` and a nullable nested object
  ``shipping`` (``city``, nullable ``zip``).
- Protobuf (proto3): v1 ``int32 id``, ``string currency``, ``float amount``, ``optional string
  note``; v2 ``int64 id`` (int -> long) and a new ``optional string country``; v3 ``double
  amount`` (float -> double, which only works because each record decodes with its own writer
  schema, then widens to the column), ``note`` removed, new ``optional string channel`` and
  ``repeated string tags``. Per the codec's presence rule a proto3 field without presence that a
  version has reads as its default when absent (``currency`` ``""``, ``tags`` ``[]``), while
  a field the version lacks is null.

The pipeline copies v1 records; v2 records are only in Kafka: ``merged`` reads two versions
(cold v1, hot v2). The pipeline copies the v2 records; v3 records are only in Kafka: ``merged``
reads three versions. Each engine must see every record once, as the newest schema's columns,
with the values exactly as produced (null for the fields its version did not have); field ids
stay stable by name and promoted types are as expected.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bergstream.core.api import VALUE_SCHEMA_ID_COLUMN
from bergstream.pipeline.settings import PipelineLake
from tests.kits.isk_gateway import (
    Gateway,
    attach_spark_catalog,
    start_gateway,
)
from tests.kits.lake import Produced, produce
from tests.pipeline.evolution_kit import (
    as_row,
    by_first,
    check_merged_everywhere,
    copy_all,
)
from tests.pipeline.property_kit import lake_and_codecs_yaml
from tests.pipeline.typed_kit import FIRST_MS, coldset

pytestmark = pytest.mark.slow

PARTS = 2
PER_VERSION = 12  # records of each version

Serialize = Callable[[dict[str, Any]], bytes]


def _base(i: int, version: int) -> dict[str, Any]:
    """The fields every version of both formats has, as read (``""`` a proto3 default)."""
    return {
        "id": i if version == 1 else 10_000_000_000 + i,
        "currency": ("EUR", "USD", "")[i % 3],
        "amount": i * 0.25 + 0.5,  # exact in a float
    }


def _note(i: int) -> str | None:
    return None if i % 2 else f"note {i}"


def _country(i: int) -> str | None:
    return None if i % 4 == 0 else f"C{i % 5}"


def _channel(i: int) -> str | None:
    return ("web", "pos", None)[i % 3]


def _tags(i: int) -> list[str]:
    return [f"t{j}" for j in range(i % 3)]


# --- JSON Schema ------------------------------------------------------------------------------

_JSON_V1_PROPERTIES: dict[str, Any] = {
    "id": {"type": "integer"},
    "currency": {"type": "string"},
    "amount": {"type": "number"},
    "note": {"type": ["string", "null"]},
}
_JSON_V2_PROPERTIES: dict[str, Any] = {
    **_JSON_V1_PROPERTIES,
    "country": {"type": ["string", "null"]},
    "tags": {"type": "array", "items": {"type": "string"}},
}
_JSON_V3_PROPERTIES: dict[str, Any] = {
    **{k: v for k, v in _JSON_V2_PROPERTIES.items() if k != "note"},
    "channel": {"type": ["string", "null"]},
    "shipping": {
        "type": ["object", "null"],
        "properties": {"city": {"type": "string"}, "zip": {"type": ["string", "null"]}},
        "required": ["city", "zip"],
    },
}


def _json_schema(properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "Order",
        "type": "object",
        "properties": properties,
        "required": list(properties),
    }


JSON_SCHEMAS = {
    1: _json_schema(_JSON_V1_PROPERTIES),
    2: _json_schema(_JSON_V2_PROPERTIES),
    3: _json_schema(_JSON_V3_PROPERTIES),
}


def json_order(i: int, version: int) -> dict[str, Any]:
    """Order ``i`` as JSON Schema version ``version`` writes it: every property, in schema
    order, null as ``null`` (the codec's canonical form, so no row keeps its bytes)."""
    value = _base(i, version)
    if version < 3:
        value["note"] = _note(i)
    if version > 1:
        value["country"] = _country(i)
        value["tags"] = _tags(i)
    if version == 3:
        value["channel"] = _channel(i)
        value["shipping"] = (
            None if i % 3 == 0 else {"city": f"city {i}", "zip": None if i % 2 else f"{i:05d}"}
        )
    assert list(value) == list(JSON_SCHEMAS[version]["properties"])
    return value


def json_serializer(registry_url: str, topic: str, version: int, workdir: Path) -> Serialize:
    """confluent-kafka's ``JSONSerializer`` of version ``version`` for ``topic``'s values."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.json_schema import JSONSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = SchemaRegistryClient({"url": registry_url})
    serializer = JSONSerializer(json.dumps(JSON_SCHEMAS[version]), client)
    context = SerializationContext(topic, MessageField.VALUE)

    def serialize(value: dict[str, Any]) -> bytes:
        return bytes(serializer(value, context) or b"")

    return serialize


# --- Protobuf ---------------------------------------------------------------------------------

_PROTO_FIELDS = {
    1: """
  int32 id = 1;
  string currency = 2;
  float amount = 3;
  optional string note = 4;
""",
    2: """
  int64 id = 1;
  string currency = 2;
  float amount = 3;
  optional string note = 4;
  optional string country = 5;
""",
    3: """
  int64 id = 1;
  string currency = 2;
  double amount = 3;
  optional string country = 5;
  optional string channel = 6;
  repeated string tags = 7;
""",
}
PROTOS = {
    version: f'syntax = "proto3";\npackage bergstream.evolution.v{version};\n\n'
    f"message Order {{{fields}}}\n"
    for version, fields in _PROTO_FIELDS.items()
}


def proto_order(i: int, version: int) -> dict[str, Any]:
    """Order ``i`` as Protobuf version ``version``'s fields read (``currency`` ``""`` and
    ``tags`` ``[]`` are proto3 defaults: absent on the wire, read as such)."""
    value = _base(i, version)
    if version < 3:
        value["note"] = _note(i)
    if version > 1:
        value["country"] = _country(i)
    if version == 3:
        value["channel"] = _channel(i)
        value["tags"] = _tags(i)
    return value


def _message_class(workdir: Path, file_name: str, text: str, full_name: str) -> Any:
    """Message ``full_name`` of the .proto ``text``, compiled with grpcio-tools' protoc as
    ``file_name`` into the default descriptor pool (added once per process)."""
    import grpc_tools
    from google.protobuf import descriptor_pb2, descriptor_pool
    from google.protobuf.message_factory import GetMessageClass
    from grpc_tools import _protoc_compiler

    (workdir / file_name).write_text(text)
    out = workdir / f"{file_name}.desc"
    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    args = [b"protoc", f"-I{workdir}".encode(), f"-I{include}".encode(),
            f"--descriptor_set_out={out}".encode(), file_name.encode()]  # fmt: skip
    assert _protoc_compiler.run_main(args) == 0
    (file,) = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName(file_name)
    except KeyError:
        pool.Add(file)
    return GetMessageClass(pool.FindMessageTypeByName(full_name))


def proto_serializer(registry_url: str, topic: str, version: int, workdir: Path) -> Serialize:
    """confluent-kafka's ``ProtobufSerializer`` of version ``version``'s ``Order`` for
    ``topic``'s values (a value's None fields are left unset)."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    order_class = _message_class(
        workdir,
        f"bergstream_evolution_v{version}.proto",
        PROTOS[version],
        f"bergstream.evolution.v{version}.Order",
    )
    client = SchemaRegistryClient({"url": registry_url})
    serializer = ProtobufSerializer(order_class, client, {"use.deprecated.format": False})
    context = SerializationContext(topic, MessageField.VALUE)

    def serialize(value: dict[str, Any]) -> bytes:
        message = order_class(**{k: v for k, v in value.items() if v is not None})
        data = bytes(serializer(message, context) or b"")
        assert data[5:6] == b"\x00", data[:8].hex()  # the first message, short index form
        return data

    return serialize


# --- the formats ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Format:
    """One value format's three versions and what its table should look like."""

    name: str
    order: Callable[[int, int], dict[str, Any]]
    serializer: Callable[[str, str, int, Path], Serialize]
    columns: tuple[str, ...]  # the value columns of all three versions, in table order
    new_in_v3: tuple[str, ...]
    cold_v1: dict[str, str]  # column -> type after the first copy (v1)
    cold_v2: dict[str, str]  # after the second copy (v1 and v2)
    merged_v3: dict[str, str]  # merged at three versions


FORMATS = [
    Format(
        "json",
        json_order,
        json_serializer,
        columns=("id", "currency", "amount", "note", "country", "tags", "channel", "shipping"),
        new_in_v3=("channel", "shipping"),
        cold_v1={"id": "long", "amount": "double"},
        cold_v2={"id": "long", "tags": "list<string>"},
        merged_v3={
            "id": "long",
            "amount": "double",
            "tags": "list<string>",
            "shipping": "struct<city: optional string, zip: optional string>",
        },
    ),
    Format(
        "protobuf",
        proto_order,
        proto_serializer,
        columns=("id", "currency", "amount", "note", "country", "channel", "tags"),
        new_in_v3=("channel", "tags"),
        cold_v1={"id": "int", "amount": "float"},
        cold_v2={"id": "long", "amount": "float"},
        merged_v3={"id": "long", "amount": "double", "tags": "list<string>"},
    ),
]


@dataclass
class Stage:
    fmt: Format
    lake: PipelineLake
    topic: str
    gateway: Gateway
    spark_catalog: str
    workdir: Path
    produced: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    schema_ids: dict[int, int] = field(default_factory=dict)

    def produce(self, version: int, indexes: range, bootstrap: str, registry_url: str) -> None:
        """Produce orders ``indexes`` as ``version`` (registering it), round robin."""
        serialize = self.fmt.serializer(registry_url, self.topic, version, self.workdir)
        produced = []
        for i in indexes:
            data = serialize(self.fmt.order(i, version))
            self.schema_ids[version] = int.from_bytes(data[1:5], "big")
            produced.append(Produced(i % PARTS, b"k%d" % i, data, (), FIRST_MS + i))
        produce(bootstrap, self.topic, produced)
        self.produced += [(version, self.fmt.order(i, version)) for i in indexes]

    def columns(self, versions: int) -> tuple[str, ...]:
        """The value columns ``merged`` has at ``versions`` versions."""
        if versions == 3:
            return self.fmt.columns
        return tuple(c for c in self.fmt.columns if c not in self.fmt.new_in_v3)

    def expected(self, columns: tuple[str, ...]) -> list[tuple[Any, ...]]:
        """Every produced value as a row of ``columns``, by id."""
        return sorted((as_row(value, columns) for _, value in self.produced), key=by_first)


@pytest.fixture(scope="module", params=FORMATS, ids=lambda f: f.name)
def stage(
    request: pytest.FixtureRequest,
    spark: Any,
    lake: PipelineLake,
    stack_env: dict[str, str],
    kafka_bootstrap: str,
    create_topic: Callable[..., str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stage]:
    fmt: Format = request.param
    registry_url = stack_env["BERGSTREAM_SCHEMA_REGISTRY_URL"]
    topic = create_topic(PARTS, prefix=f"typed-evolution-{fmt.name}")
    workdir = tmp_path_factory.mktemp(f"typed-evolution-{fmt.name}")
    registry = {"url": registry_url, "subject_refresh_seconds": 0, "timeout_seconds": 2}
    extra = lake_and_codecs_yaml(lake, registry, topic)
    gateway = start_gateway(kafka_bootstrap, workdir, chunk_records=5, extra=extra)
    name = attach_spark_catalog(spark, gateway.catalog_url)
    try:
        yield Stage(fmt, lake, topic, gateway, name, workdir)
    finally:
        code = gateway.process.stop()
        assert code == 0, f"bergstream run exited with {code}:\n{gateway.process.log()}"


def _check_merged(spark: Any, stage: Stage, versions: int) -> Any:
    """All three engines read every produced value once, exactly, as the newest schema's
    columns (of ``versions`` versions); the merged table's schema."""
    assert len({version for version, _ in stage.produced}) == versions
    columns = stage.columns(versions)
    merged = stage.gateway.catalog().load_table(f"merged.{stage.topic}").schema()
    value_columns = [c for c in merged.column_names if c in stage.fmt.columns]
    assert tuple(value_columns) == columns
    expected = stage.expected(columns)
    check_merged_everywhere(
        spark, stage.gateway, stage.spark_catalog, stage.topic, columns, expected
    )
    return merged


def _types(schema: Any, names: dict[str, str]) -> dict[str, str]:
    """The types of columns ``names``, without their nested field ids."""
    return {name: re.sub(r"\b\d+: ", "", str(schema.find_field(name).field_type)) for name in names}


def test_merged_reads_two_then_three_versions_of_the_format_with_every_engine(
    spark: Any, stage: Stage, kafka_bootstrap: str, stack_env: dict[str, str], tmp_path: Path
) -> None:
    fmt = stage.fmt
    registry_url = stack_env["BERGSTREAM_SCHEMA_REGISTRY_URL"]
    stage.produce(1, range(PER_VERSION), kafka_bootstrap, registry_url)
    copy_all(spark, stage.lake, stage.topic, registry_url, tmp_path)
    cold_v1 = coldset(stage.lake, stage.topic).schema()
    assert _types(cold_v1, fmt.cold_v1) == fmt.cold_v1

    # two versions: v1 in the coldset, v2 only in Kafka
    stage.produce(2, range(PER_VERSION, 2 * PER_VERSION), kafka_bootstrap, registry_url)
    merged = _check_merged(spark, stage, versions=2)
    assert str(merged.find_field("id").field_type) == "long"
    for column in cold_v1.fields:
        assert merged.find_field(column.name).field_id == column.field_id
    assert merged.find_field("country").field_id > cold_v1.highest_field_id

    # three versions: v1 and v2 in the coldset (files of the older types), v3 only in Kafka
    copy_all(spark, stage.lake, stage.topic, registry_url, tmp_path)
    cold_v2 = coldset(stage.lake, stage.topic).schema()
    assert _types(cold_v2, fmt.cold_v2) == fmt.cold_v2
    stage.produce(3, range(2 * PER_VERSION, 3 * PER_VERSION), kafka_bootstrap, registry_url)
    merged = _check_merged(spark, stage, versions=3)
    for column in cold_v2.fields:  # ids stable by name across all three versions
        assert merged.find_field(column.name).field_id == column.field_id
    assert _types(merged, fmt.merged_v3) == fmt.merged_v3
    for name in fmt.new_in_v3:  # new columns (and their nested fields) get new ids
        new = merged.find_field(name)
        numbers = [new.field_id, *(f.field_id for f in getattr(new.field_type, "fields", ()))]
        assert min(numbers) > cold_v2.highest_field_id, (name, new)
    assert "note" in merged.column_names  # a removed optional field stays, null from v3 on

    ids = {
        row[VALUE_SCHEMA_ID_COLUMN]
        for row in stage.gateway.catalog()
        .load_table(f"merged.{stage.topic}")
        .scan(selected_fields=(VALUE_SCHEMA_ID_COLUMN,))
        .to_arrow()
        .to_pylist()
    }
    assert ids == set(stage.schema_ids.values()) and len(ids) == 3
