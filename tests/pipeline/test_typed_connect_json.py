"""Kafka Connect JSON envelopes (the ``connect-json`` codec: ``JsonConverter`` with
``schemas.enable=true``, no registry) of a Debezium-like topic, values and keys, over two
pipeline runs: the payload's fields become the table's columns, typed by the embedded Connect
schemas (decimals, Debezium's timestamps, dates and uuids); a second schema version (a new
column inside ``before``/``after``, a new top-level ``transaction``) folds into the same table,
older rows reading null there; a null payload reads as a null value and a value that is not an
envelope keeps its bytes with the cause. Every envelope keeps its bytes in ``kafka_value``
(``kafka_key``), so after DeleteRecords of everything KSI serves every record byte for byte
from the coldset."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bergstream.core.api import (
    KEY_ERROR_COLUMN,
    KEY_SCHEMA_ID_COLUMN,
    VALUE_ERROR_COLUMN,
    VALUE_SCHEMA_ID_COLUMN,
)
from bergstream.pipeline.settings import PipelineLake
from bergstream.pipeline.stream import run_pipeline
from bergstream.pipeline.typed import topic_typing
from tests.kits import connect_gen as cg
from tests.kits.avro_registry import typed_context
from tests.kits.connect_gen import envelope, field, schema, struct
from tests.kits.lake import Produced, produce
from tests.pipeline.property_kit import lake_yaml, read_through_ksi, take_all_records
from tests.pipeline.typed_kit import FIRST_MS, coldset, sorted_rows

pytestmark = pytest.mark.slow

PARTS = 2

ROW_V1 = [
    field("id", schema("int32")),
    field("name", schema("string", optional=True)),
    field("price", cg.decimal_schema(2, 10)),
    field("created", schema("int64", optional=True, name=cg.DBZ_MICRO_TIMESTAMP)),
    field("updated", schema("string", optional=True, name=cg.DBZ_ZONED_TIMESTAMP)),
    field("day", schema("int32", optional=True, name=cg.DBZ_DATE)),
    field("token", schema("string", optional=True, name=cg.DBZ_UUID)),
]
ROW_V2 = [*ROW_V1, field("email", schema("string", optional=True))]
SOURCE = struct(
    field("connector", schema("string")),
    field("db", schema("string")),
    field("table", schema("string")),
    field("ts_ms", schema("int64")),
    name="io.debezium.connector.postgresql.Source",
)
KEY = struct(field("id", schema("int32")), name="dbserver1.inventory.orders.Key")


def value_schema(row: list[dict[str, Any]], *, transaction: bool = False) -> dict[str, Any]:
    """The envelope schema Debezium gives a table of ``row``'s columns."""
    image = struct(*row, optional=True, name="dbserver1.inventory.orders.Value")
    fields = [
        field("before", image),
        field("after", image),
        field("source", SOURCE),
        field("op", schema("string")),
        field("ts_ms", schema("int64", optional=True)),
    ]
    if transaction:
        block = struct(field("id", schema("string")), field("total_order", schema("int64")),
                       optional=True, name="event.block")  # fmt: skip
        fields.append(field("transaction", block))
    return struct(*fields, name="dbserver1.inventory.orders.Envelope")


def image(i: int, *, email: bool = False) -> dict[str, Any]:
    """A row of the table (logical values)."""
    out: dict[str, Any] = {
        "id": i,
        "name": f"order {i} ✓",
        "price": decimal.Decimal(i * 1001).scaleb(-2) * (-1 if i % 5 == 0 else 1),
        "created": dt.datetime(2024, 5, 1, 12, 0, 0) + dt.timedelta(microseconds=i * 1_000_001),
        "updated": dt.datetime(2024, 5, 2, tzinfo=dt.UTC) + dt.timedelta(seconds=i),
        "day": dt.date(2024, 1, 1) + dt.timedelta(days=i),
        "token": uuid.UUID(int=i * 7919),
    }
    if email:
        out["email"] = f"o{i}@example.com"
    return out


def event(i: int, op: str, *, v2: bool = False) -> dict[str, Any]:
    """A change event of row ``i`` (``c``reate, ``u``pdate or ``d``elete)."""
    row = image(i, email=v2)
    out: dict[str, Any] = {
        "before": None if op == "c" else {**row, "name": "old"},
        "after": None if op == "d" else row,
        "source": {
            "connector": "postgresql",
            "db": "inventory",
            "table": "orders",
            "ts_ms": 1_700_000_000_000 + i,
        },
        "op": op,
        "ts_ms": 1_700_000_000_100 + i,
    }
    if v2:
        out["transaction"] = {"id": f"tx{i}", "total_order": i}
    return out


def first_batch() -> list[tuple[int, bytes | None, dict[str, Any] | None]]:
    """(row id, value, the event) of schema version 1, a delete's tombstone, a null payload
    and plain JSON."""
    of = value_schema(ROW_V1)
    out: list[tuple[int, bytes | None, dict[str, Any] | None]] = []
    for i in range(1, 9):
        op = "c" if i < 6 else ("u" if i < 8 else "d")
        out.append((i, envelope(of, event(i, op)), event(i, op)))
    out.append((8, None, None))  # the tombstone Debezium writes after a delete
    out.append((9, envelope(of, None), None))  # a null payload
    out.append((10, b'{"id":10,"op":"c"}', None))  # plain JSON (schemas.enable=false)
    return out


def second_batch() -> list[tuple[int, bytes | None, dict[str, Any] | None]]:
    """Schema version 2: ``email`` in the row images, a ``transaction`` block."""
    of = value_schema(ROW_V2, transaction=True)
    return [(i, envelope(of, event(i, "u", v2=True)), event(i, "u", v2=True)) for i in (11, 12)]


def produce_batch(
    bootstrap: str, topic: str, batch: list[tuple[int, bytes | None, Any]], start: int
) -> None:
    produce(bootstrap, topic, [
        Produced(i % PARTS, envelope(KEY, {"id": i}), value, (("n", b"%d" % n),), FIRST_MS + n)
        for n, (i, value, _) in enumerate(batch, start)
    ])  # fmt: skip


def test_connect_json_envelopes_become_typed_columns_and_keep_their_bytes(
    spark: Any,
    lake: PipelineLake,
    kafka_bootstrap: str,
    create_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    topic = create_topic(PARTS, prefix="typed-connect-json")
    codecs = {"topics": [{"match": topic, "value": "connect-json", "key": "connect-json"}]}
    typing = topic_typing(typed_context(tmp_path, codecs), topic)  # no registry at all
    assert typing is not None
    produced: list[tuple[int, bytes | None, dict[str, Any] | None]] = []
    for batch in (first_batch(), second_batch()):
        produce_batch(kafka_bootstrap, topic, batch, len(produced))
        produced.extend(batch)
        result = run_pipeline(spark, lake, topic, once=True, report=lambda line: None,
                              codecs=typing)  # fmt: skip
        assert result.records == len(batch)

    table = coldset(lake, topic)
    schema_ = table.schema()
    names = [f.name for f in schema_.fields]
    for column in ("before", "after", "source", "op", "ts_ms", "transaction", "key_id"):
        assert column in names, names
    after = schema_.find_field("after").field_type
    types = {f.name: str(f.field_type) for f in after.fields}
    assert types == {
        "id": "int", "name": "string", "price": "decimal(10, 2)", "created": "timestamp",
        "updated": "timestamptz", "day": "date", "token": "uuid", "email": "string",
    }  # fmt: skip
    assert str(schema_.find_field("key_id").field_type) == "int"

    rows = sorted_rows(table.scan().to_arrow())
    assert len(rows) == len(produced)
    value_ids: set[int] = set()
    for row in rows:
        number = int(row["kafka_headers"][0]["value"])
        i, value, want = produced[number]
        where = f"record {number}: {value!r}"
        assert row["kafka_key"] == envelope(KEY, {"id": i}), where
        if value is not None and value.startswith(b'{"id"'):
            # JSON without an envelope: read as the json codec reads it, its canonical text
            # re-encoded (no bytes kept)
            assert (row["id"], row["op"], row[VALUE_ERROR_COLUMN]) == (10, "c", None), where
            assert row[VALUE_SCHEMA_ID_COLUMN] is not None and row["kafka_value"] is None
            continue
        # every envelope's bytes are kept (KSI serves them); keys too
        assert row["kafka_value"] == value, where
        assert row["key_id"] == i and row[KEY_ERROR_COLUMN] is None, where
        assert row[KEY_SCHEMA_ID_COLUMN] is not None, where
        if value is None or want is None:  # a tombstone, or a null payload (not an error)
            assert all(row[c] is None for c in ("before", "after", "source", "op")), where
            assert row[VALUE_ERROR_COLUMN] is None, where
            assert (row[VALUE_SCHEMA_ID_COLUMN] is None) == (value is None), where
            continue
        assert row[VALUE_ERROR_COLUMN] is None, (where, row[VALUE_ERROR_COLUMN])
        value_ids.add(row[VALUE_SCHEMA_ID_COLUMN])
        assert row["op"] == want["op"] and row["ts_ms"] == want["ts_ms"], where
        assert row["source"] == want["source"], where
        for side in ("before", "after"):
            image_ = want[side]
            expected = None if image_ is None else {"email": None, **image_}
            assert row[side] == expected, (where, side)
        assert row["transaction"] == want.get("transaction"), where
    assert len(value_ids) == 2  # the two schema versions (and the plain JSON shape)
    properties = table.properties
    for schema_id in value_ids:
        stored = json.loads(properties[f"bergstream.schema.{schema_id}"])
        assert stored["schemaType"] == "CONNECT"

    # KSI gives every record back byte for byte from the coldset alone.
    held = take_all_records(kafka_bootstrap, topic, PARTS)
    served, log = read_through_ksi(
        tmp_path, kafka_bootstrap, topic, lake_yaml(lake, codecs), PARTS, len(held)
    )
    assert served == held, log[-3000:]
