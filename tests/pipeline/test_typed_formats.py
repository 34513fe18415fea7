"""JSON Schema and Protobuf topics end to end, as Avro ones: values produced with
confluent-kafka's ``JSONSerializer`` and ``ProtobufSerializer`` through the stack's Apicurio
registry (plus hand-made non-canonical and undecodable ones) go Kafka → pipeline → Iceberg, typed
by a ``value: registry`` rule with no per-format setting: PyIceberg and Spark read the columns
core's decoder makes (``qty`` is the column ``qty``, a repeated string field or a JSON array of
strings a list column); ISK's hotset files hold the coldset's rows; after DeleteRecords of
everything, KSI serves every record byte for byte from the coldset."""

from __future__ import annotations

import datetime as dt
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bergstream.core.api import VALUE_ERROR_COLUMN, VALUE_SCHEMA_ID_COLUMN
from bergstream.pipeline.settings import PipelineLake
from bergstream.pipeline.stream import run_pipeline
from tests.kits.ksi_stack import start_ksi_proxy
from tests.kits.lake import Produced, consume_all, produce, table_rows_spark
from tests.pipeline.property_kit import (
    by_position_seen,
    coldset_file_rows,
    delete_everything,
    hotset_rows,
    ksi_config,
    read_all,
)
from tests.pipeline.typed_kit import (
    FIRST_MS,
    coldset,
    decoder_of,
    sorted_rows,
    truth_table,
    typing_for,
)

pytestmark = pytest.mark.slow

PARTS = 2
COUNT = 24  # serializer-made values; then the odd ones
AT = dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.UTC)

JSON_SCHEMA: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "Order",
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "sku": {"type": "string"},
        "qty": {"type": "integer"},
        "price": {"type": "number"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "note": {"type": ["string", "null"]},
        "at": {"type": "string", "format": "date-time"},
    },
    "required": ["id", "sku", "qty", "price", "tags", "note", "at"],
}

PROTO = """
syntax = "proto3";
package bergstream.e2e;
import "google/protobuf/timestamp.proto";

message Order {
  int64 id = 1;
  string sku = 2;
  int32 qty = 3;
  double price = 4;
  repeated string tags = 5;
  optional string note = 6;
  google.protobuf.Timestamp at = 7;
  map<string, int64> counts = 8;
}
"""


def order(i: int) -> dict[str, Any]:
    """Order ``i`` (the fields both formats share)."""
    return {
        "id": 1_000_000_000_000 + i,
        "sku": f"sku-{i}-é",
        "qty": i % 7,
        "price": i * 1.25 + 0.5,
        "tags": [f"t{j}" for j in range(i % 3)],
        "note": None if i % 2 else f"note {i}",
    }


def json_value(i: int) -> dict[str, Any]:
    return {**order(i), "at": (AT + dt.timedelta(seconds=i)).strftime("%Y-%m-%dT%H:%M:%SZ")}


def _framed(schema_id: int, payload: bytes) -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big") + payload


def json_records(registry_url: str, topic: str) -> list[bytes]:
    """JSONSerializer's values, then: spaces, other key order, a type that does not fit, no
    framing."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.json_schema import JSONSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = SchemaRegistryClient({"url": registry_url})
    serializer = JSONSerializer(json.dumps(JSON_SCHEMA), client)
    context = SerializationContext(topic, MessageField.VALUE)
    values = [bytes(serializer(json_value(i), context) or b"") for i in range(COUNT)]
    schema_id = int.from_bytes(values[0][1:5], "big")
    odd = json_value(COUNT)
    reordered = json.dumps(dict(reversed(odd.items())), separators=(",", ":"))
    values += [
        _framed(schema_id, json.dumps(odd).encode()),  # ", " and ": " separators
        _framed(schema_id, reordered.encode()),
        _framed(schema_id, b'{"id":"not a number"}'),
        b"plain text, no framing",
    ]
    return values


def _order_class(workdir: Path) -> Any:
    """The ``Order`` message class, compiled from :data:`PROTO` with grpcio-tools' protoc
    into the default descriptor pool (where the serializer finds ``Timestamp``)."""
    import grpc_tools
    from google.protobuf import descriptor_pb2, descriptor_pool
    from google.protobuf.message_factory import GetMessageClass
    from grpc_tools import _protoc_compiler

    name = "bergstream_e2e_order.proto"
    (workdir / name).write_text(PROTO)
    out = workdir / "order.desc"
    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    args = [b"protoc", f"-I{workdir}".encode(), f"-I{include}".encode(),
            f"--descriptor_set_out={out}".encode(), name.encode()]  # fmt: skip
    assert _protoc_compiler.run_main(args) == 0
    (file,) = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName(name)
    except KeyError:
        pool.Add(file)
    return GetMessageClass(pool.FindMessageTypeByName("bergstream.e2e.Order"))


def protobuf_records(registry_url: str, topic: str) -> list[bytes]:
    """ProtobufSerializer's values, then: an unknown field appended, the long index form
    ``02 00``, a truncated message, no framing."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    with tempfile.TemporaryDirectory() as workdir:
        order_class = _order_class(Path(workdir))
    client = SchemaRegistryClient({"url": registry_url})
    serializer = ProtobufSerializer(order_class, client, {"use.deprecated.format": False})
    context = SerializationContext(topic, MessageField.VALUE)
    values = []
    for i in range(COUNT):
        fields = {k: v for k, v in order(i).items() if v is not None}
        message = order_class(**fields, counts={"a": i, "b": -i} if i % 4 == 0 else {})
        message.at.FromDatetime(AT + dt.timedelta(seconds=i))
        values.append(bytes(serializer(message, context) or b""))
    first = values[1]
    assert first[5:6] == b"\x00", first[:8].hex()  # the short message-index form
    values += [
        first + b"\xa8\x06\x01",  # field 101 (varint 1): unknown to the schema
        first[:5] + b"\x02\x00" + first[6:],  # the same message, indexes [0] in the long form
        first[:-3],  # truncated
        b"plain text, no framing",
    ]
    return values


@dataclass
class Format:
    name: str
    make: Callable[[str, str], list[bytes]]
    kept: int  # how many odd values keep their bytes (decoded or not)
    failed: int  # how many of them do not decode
    odd_orders: tuple[int, ...]  # the orders the odd values that decode hold
    #: serializer-made values that may keep their bytes: ProtobufSerializer writes map entries
    #: in hash order, which a deterministic re-serialization (sorted keys) may not reproduce
    may_keep: Callable[[int], bool]


FORMATS = [
    Format(
        "json", json_records, kept=4, failed=2, odd_orders=(COUNT, COUNT), may_keep=lambda i: False
    ),
    Format(
        "protobuf",
        protobuf_records,
        kept=4,
        failed=2,
        odd_orders=(1, 1),
        may_keep=lambda i: i % 4 == 0,
    ),
]


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_a_topic_of_the_format_round_trips(
    fmt: Format,
    spark: Any,
    lake: PipelineLake,
    stack_env: dict[str, str],
    kafka_bootstrap: str,
    create_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    registry_url = stack_env["BERGSTREAM_SCHEMA_REGISTRY_URL"]
    topic = create_topic(PARTS, prefix=f"typed-{fmt.name}")
    values = fmt.make(registry_url, topic)
    produce(kafka_bootstrap, topic, [
        Produced(n % PARTS, b"k%d" % n, v, (("n", b"%d" % n),), FIRST_MS + n)
        for n, v in enumerate(values)
    ])  # fmt: skip
    typing = typing_for(tmp_path, registry_url, topic)
    result = run_pipeline(spark, lake, topic, once=True, report=lambda line: None, codecs=typing)
    assert result.records == len(values)

    # PyIceberg reads the rows core's decoder makes of the same records; Spark the same.
    truth = truth_table(kafka_bootstrap, topic, PARTS)
    decoder = decoder_of(typing)
    table = coldset(lake, topic)
    assert table.schema().as_struct() == decoder.layout.schema.as_struct()
    by_pyiceberg = sorted_rows(table.scan().to_arrow())
    assert by_pyiceberg == sorted_rows(decoder.decode(truth).table)
    assert str(table.schema().find_field("qty").field_type) in ("int", "long")
    assert str(table.schema().find_field("tags").field_type).startswith("list<string>")
    columns = ["kafka_partition", "kafka_offset", "kafka_value", VALUE_SCHEMA_ID_COLUMN,
               VALUE_ERROR_COLUMN, "id", "sku", "qty", "price", "tags", "note"]  # fmt: skip
    by_spark = table_rows_spark(spark, lake, topic)
    assert [[r[c] for c in columns] for r in by_spark] == [
        [r[c] for c in columns] for r in by_pyiceberg
    ]
    decoded = [r for r in by_pyiceberg if r[VALUE_ERROR_COLUMN] is None]
    expected = sorted((order(i)["id"], order(i)["sku"], order(i)["qty"], order(i)["tags"])
                      for i in [*range(COUNT), *fmt.odd_orders])  # fmt: skip
    assert sorted((r["id"], r["sku"], r["qty"], r["tags"]) for r in decoded) == expected
    number = {(r["kafka_partition"], r["kafka_offset"]): int(r["kafka_headers"][0]["value"])
              for r in by_pyiceberg}  # fmt: skip
    kept = {number[(r["kafka_partition"], r["kafka_offset"])] for r in by_pyiceberg
            if r["kafka_value"] is not None}  # fmt: skip
    assert {n for n in kept if n < COUNT and not fmt.may_keep(n)} == set()
    assert len([n for n in kept if n >= COUNT]) == fmt.kept
    assert len(by_pyiceberg) - len(decoded) == fmt.failed

    # ISK's hotset files hold the coldset's rows.
    hot_schema, by_hotset = hotset_rows(tmp_path, kafka_bootstrap, registry_url, topic, lake)
    assert hot_schema.as_struct() == table.schema().as_struct()
    assert by_hotset == coldset_file_rows(table)

    # KSI gives every record back byte for byte from the coldset alone.
    records = consume_all(kafka_bootstrap, topic, PARTS)
    truth_seen = by_position_seen(records)
    ends = {p: 1 + max(r.record.offset for r in records if r.partition == p) for p in range(PARTS)}
    delete_everything(kafka_bootstrap, topic, ends)
    lake_yaml = ksi_config(lake, registry_url, topic)
    proxy = start_ksi_proxy(tmp_path, kafka_bootstrap, [topic], lake_yaml)
    try:
        got = read_all(proxy.bootstrap, topic, PARTS, len(truth_seen))
    finally:
        proxy.stop()
    assert got == truth_seen, proxy.log()[-3000:]
