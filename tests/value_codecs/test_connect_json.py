"""The ``connect-json`` codec: Kafka Connect ``JsonConverter`` envelopes
(``schemas.enable=true``) as typed columns. Every Connect and Debezium type's mapping and
values, decimals, null payloads, values that are not envelopes, schema evolution through
core's layout functions (as the ``json`` codec's tests do), and a property test of random
Connect schemas and values written as JsonConverter writes them."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import pickle
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
    UUIDType,
)

from bergstream.core.api import (
    KEY_ERROR_COLUMN,
    KEY_SCHEMA_ID_COLUMN,
    ROW_ARROW_SCHEMA,
    ROW_SCHEMA,
    VALUE_ERROR_COLUMN,
    VALUE_SCHEMA_ID_COLUMN,
    RegisteredSchema,
    SchemaNotExpressible,
    ShapesToFold,
    SideCodecs,
    StoredSchemas,
    TopicCodecs,
    TypedRows,
    build_layout_of_columns,
    build_layout_of_shapes,
)
from bergstream.core.plugins import load_registry
from bergstream.core.typed.codecs_config import CODEC_KIND, CodecsSettings, check_codecs
from bergstream.plugins.value_codecs.connect_json.codec import ConnectJsonCodec
from bergstream.plugins.value_codecs.connect_json.envelopes import NOT_AN_ENVELOPE, schema_id
from bergstream.plugins.value_codecs.connect_json.values import decimal_text
from tests.kits import connect_gen as cg
from tests.kits.connect_gen import envelope, field, schema, struct

SUBJECT = "t-value"
LAST_ID = ROW_SCHEMA.highest_field_id


def binary(*values: bytes | None) -> pa.Array:
    return pa.array(list(values), pa.large_binary())


def declared(codec: ConnectJsonCodec, *values: bytes | None) -> list[RegisteredSchema]:
    return codec.shapes(binary(*values), None, SUBJECT).schemas


def decode(of: dict[str, Any], *values: Any) -> tuple[list[Any], list[str | None]]:
    """Values (logical form) written as envelopes of ``of``, decoded by the codec."""
    codec = ConnectJsonCodec()
    payloads = binary(*(envelope(of, v) for v in values))
    (shape,) = declared(codec, *payloads.to_pylist())
    got = codec.decode(shape, payloads)
    assert got.keep_bytes.all()
    return got.values.to_pylist(), got.errors


# --------------------------------------------------------------------------- type mapping

EVERY_TYPE = struct(
    field("i8", schema("int8")),
    field("i16", schema("int16")),
    field("i32", schema("int32")),
    field("i64", schema("int64")),
    field("f32", schema("float")),
    field("f64", schema("double")),
    field("flag", schema("boolean")),
    field("text", schema("string")),
    field("blob", schema("bytes", optional=True)),
    field("amount", cg.decimal_schema(2, 10)),
    field("wide", cg.decimal_schema(4)),
    field("day", schema("int32", name=cg.DATE)),
    field("clock", schema("int32", name=cg.TIME)),
    field("at", schema("int64", name=cg.TIMESTAMP)),
    field("dbz_day", schema("int32", name=cg.DBZ_DATE)),
    field("dbz_time", schema("int32", name=cg.DBZ_TIME)),
    field("dbz_micro_time", schema("int64", name=cg.DBZ_MICRO_TIME)),
    field("dbz_nano_time", schema("int64", name=cg.DBZ_NANO_TIME)),
    field("dbz_ts", schema("int64", name=cg.DBZ_TIMESTAMP)),
    field("dbz_micro_ts", schema("int64", name=cg.DBZ_MICRO_TIMESTAMP)),
    field("dbz_nano_ts", schema("int64", name=cg.DBZ_NANO_TIMESTAMP)),
    field("zoned", schema("string", name=cg.DBZ_ZONED_TIMESTAMP)),
    field("doc", schema("string", name=cg.DBZ_JSON)),
    field("ident", schema("string", name=cg.DBZ_UUID)),
    field("number", cg.variable_decimal_schema()),
    field("unknown", schema("int64", name="io.debezium.time.MicroDuration")),
    field("tags", schema("array", items=schema("string"), optional=True)),
    field("attrs", schema("map", keys=schema("string"), values=schema("int64", optional=True))),
    field("by_id", schema("map", keys=schema("int32"), values=schema("string"), optional=True)),
    field("inner", struct(field("a", schema("int32", optional=True)), optional=True)),
)

EVERY_TYPE_ICEBERG = {
    "i8": IntegerType(),
    "i16": IntegerType(),
    "i32": IntegerType(),
    "i64": LongType(),
    "f32": FloatType(),
    "f64": DoubleType(),
    "flag": BooleanType(),
    "text": StringType(),
    "blob": BinaryType(),
    "amount": DecimalType(10, 2),
    "wide": DecimalType(38, 4),
    "day": DateType(),
    "clock": LongType(),
    "at": TimestamptzType(),
    "dbz_day": DateType(),
    "dbz_time": LongType(),
    "dbz_micro_time": LongType(),
    "dbz_nano_time": LongType(),
    "dbz_ts": TimestampType(),
    "dbz_micro_ts": TimestampType(),
    "dbz_nano_ts": TimestampType(),
    "zoned": TimestamptzType(),
    "doc": StringType(),
    "ident": UUIDType(),
    "number": StringType(),
    "unknown": LongType(),
}

EVERY_VALUE = {
    "i8": -128,
    "i16": 32767,
    "i32": -(2**31),
    "i64": 2**63 - 1,
    "f32": 1.5,
    "f64": -2.25e300,
    "flag": True,
    "text": "héllo ✓",
    "blob": b"\x00\xffbytes",
    "amount": decimal.Decimal("-12345678.90"),
    "wide": decimal.Decimal("1234567890123456789012345678901234.5678"),
    "day": dt.date(2024, 2, 29),
    "clock": (13 * 3600 + 14 * 60 + 15) * 1_000_000 + 123_000,
    "at": dt.datetime(2024, 2, 29, 13, 14, 15, 123000, tzinfo=dt.UTC),
    "dbz_day": dt.date(1969, 12, 31),
    "dbz_time": 45_296_789_000,
    "dbz_micro_time": 45_296_789_012,
    "dbz_nano_time": 45_296_789_012,
    "dbz_ts": dt.datetime(2018, 6, 20, 15, 13, 16, 945000),
    "dbz_micro_ts": dt.datetime(2018, 6, 20, 15, 13, 16, 945104),
    "dbz_nano_ts": dt.datetime(1960, 1, 1, 0, 0, 0, 1),
    "zoned": dt.datetime(2018, 6, 20, 13, 13, 16, 945104, tzinfo=dt.UTC),
    "doc": '{"a": [1, 2]}',
    "ident": uuid.UUID("0e3c5b52-2d4f-4a4b-9a38-3b1c6e5f2a10"),
    "number": decimal.Decimal("-0.00500"),
    "unknown": 86_400_000_000,
    "tags": ["a", None],
    "attrs": [("x", 1), ("y", None)],
    "by_id": [(7, "seven"), (-1, "minus one")],
    "inner": {"a": None},
}


def test_every_connect_and_debezium_type_maps_and_decodes() -> None:
    codec = ConnectJsonCodec()
    (shape,) = declared(codec, envelope(EVERY_TYPE, EVERY_VALUE))
    type_ = codec.iceberg_type(shape, None)
    assert isinstance(type_, StructType)
    got = {f.name: f.field_type for f in type_.fields}
    for name, expected in EVERY_TYPE_ICEBERG.items():
        assert got[name] == expected, name
    tags, attrs, by_id, inner = got["tags"], got["attrs"], got["by_id"], got["inner"]
    assert isinstance(tags, ListType) and tags.element_type == StringType()
    assert tags.element_required  # items not optional
    assert isinstance(attrs, MapType) and attrs.key_type == StringType()
    assert attrs.value_type == LongType() and not attrs.value_required
    assert isinstance(by_id, MapType) and by_id.key_type == IntegerType()
    assert isinstance(inner, StructType) and inner.fields[0].field_type == IntegerType()
    # required fields (optional: false) are required in the type; the layout makes columns
    # optional anyway
    assert type_.field_by_name("i8").required and not type_.field_by_name("blob").required

    values, errors = decode(EVERY_TYPE, {**EVERY_VALUE, "tags": ["a", "b"]})
    assert errors == [None]
    (row,) = values
    want = {**EVERY_VALUE, "tags": ["a", "b"]}
    want["number"] = "-0.00500"  # the exact text, scale kept
    want["dbz_nano_ts"] = dt.datetime(1960, 1, 1, 0, 0, 0, 1)
    assert row == want


def test_times_and_timestamps_are_read_in_their_units() -> None:
    of = struct(
        field("clock", schema("int32", name=cg.TIME)),
        field("nano_time", schema("int64", name=cg.DBZ_NANO_TIME)),
        field("nano_ts", schema("int64", name=cg.DBZ_NANO_TIMESTAMP)),
        field("zoned", schema("string", name=cg.DBZ_ZONED_TIMESTAMP)),
    )
    raw = {"clock": 1_500, "nano_time": 1_999, "nano_ts": -1, "zoned": "2024-01-01T02:00:00+02:00"}
    codec = ConnectJsonCodec()
    text = json.dumps({"schema": of, "payload": raw}, separators=(",", ":")).encode()
    (shape,) = declared(codec, text)
    (row,) = codec.decode(shape, binary(text)).values.to_pylist()
    assert row["clock"] == 1_500_000  # ms -> µs since midnight
    assert row["nano_time"] == 1  # ns -> µs, truncated
    assert row["nano_ts"] == dt.datetime(1969, 12, 31, 23, 59, 59, 999999)  # toward the past
    assert row["zoned"] == dt.datetime(2024, 1, 1, tzinfo=dt.UTC)  # the instant, in UTC


def test_a_payload_that_is_not_a_struct_is_one_value_column() -> None:
    of = schema("string", name=cg.DBZ_UUID)
    codec = ConnectJsonCodec()
    (shape,) = declared(codec, envelope(of, uuid.UUID(int=5)))
    assert codec.iceberg_type(shape, None) == UUIDType()
    values, errors = decode(of, uuid.UUID(int=5), uuid.UUID(int=6))
    assert values == [uuid.UUID(int=5), uuid.UUID(int=6)] and errors == [None, None]


def test_values_that_do_not_fit_fail_their_row_with_the_path() -> None:
    of = struct(
        field("id", schema("int32")),
        field("after", struct(field("n", schema("int8", optional=True)), optional=True)),
        field("tags", schema("array", items=schema("string"), optional=True)),
        field("day", schema("int32", optional=True, name=cg.DATE)),
        field("ident", schema("string", optional=True, name=cg.DBZ_UUID)),
        field("zoned", schema("string", optional=True, name=cg.DBZ_ZONED_TIMESTAMP)),
        field("blob", schema("bytes", optional=True)),
    )
    codec = ConnectJsonCodec()

    def cause(payload: dict[str, Any]) -> str | None:
        text = json.dumps({"schema": of, "payload": payload}).encode()
        (shape,) = declared(codec, text)
        got = codec.decode(shape, binary(text))
        assert got.values.to_pylist() == [None] or got.errors == [None]
        return got.errors[0]

    assert cause({"id": 1}) is None  # absent optional fields are null
    assert cause({"id": 1, "extra": "ignored"}) is None
    assert cause({}) == "field id: null where the schema requires a value"
    assert cause({"id": "1"}) == "field id: expected an int32 (integer), got string"
    assert cause({"id": 2**31}) == f"field id: {2**31} is out of the int32 range"
    assert cause({"id": 1.0}) == "field id: expected an int32 (integer), got number"
    assert cause({"id": 1, "after": {"n": 300}}) == "field after.n: 300 is out of the int8 range"
    assert cause({"id": 1, "tags": ["a", None]}) == (
        "field tags[1]: null where the schema requires a value"
    )
    assert cause({"id": 1, "day": "2024-01-01"}) == (
        "field day: expected an int32 (integer), got string"
    )
    assert cause({"id": 1, "ident": "nope"}) == "field ident: not a uuid: 'nope'"
    assert cause({"id": 1, "zoned": "2024-01-01T00:00:00"}) == (
        "field zoned: an ISO-8601 timestamp without an offset: '2024-01-01T00:00:00'"
    )
    assert cause({"id": 1, "blob": "!!"}) == "field blob: not base64 text: '!!'"
    assert cause([1]) == "payload: expected an object (a struct), got array"  # type: ignore[arg-type]


def test_floats_read_what_jackson_writes() -> None:
    of = struct(field("x", schema("double", optional=True)), field("y", schema("float")))
    codec = ConnectJsonCodec()
    texts = [
        b'{"schema":' + json.dumps(of).encode() + b',"payload":{"x":1.0E10,"y":"NaN"}}',
        b'{"schema":' + json.dumps(of).encode() + b',"payload":{"x":"-Infinity","y":2}}',
    ]
    (shape,) = declared(codec, *texts)
    values = codec.decode(shape, binary(*texts)).values.to_pylist()
    assert values[0]["x"] == 1e10 and values[0]["y"] != values[0]["y"]  # NaN
    assert values[1] == {"x": float("-inf"), "y": 2.0}


def test_a_required_null_reads_the_schema_default() -> None:
    of = struct(
        field("id", schema("int32")),
        field("status", schema("string", default="new")),
        field("note", schema("string", optional=True, default="n/a")),
        field("amount", cg.decimal_schema(2, optional=False) | {"default": cg.b64(b"\x01")}),
    )
    values, errors = decode(of, {"id": 1, "status": None, "note": None, "amount": None})
    assert errors == [None]
    # a required field's null reads its default (as JsonConverter reads it); an optional
    # field's null stays null
    assert values == [{"id": 1, "status": "new", "note": None, "amount": decimal.Decimal("0.01")}]


# --------------------------------------------------------------------------- decimals


@pytest.mark.parametrize(
    ("scale", "precision", "value"),
    [
        (2, 10, "123.45"),
        (2, 10, "-123.45"),
        (2, 10, "0.00"),
        (2, 10, "-0.01"),
        (2, 10, "99999999.99"),
        (2, 10, "-99999999.99"),
        (0, 5, "12345"),
        (0, 5, "-1"),
        (0, 1, "-9"),
        (0, None, "-" + "9" * 38),
        (2, None, "9" * 36 + ".99"),
        (0, 38, str(-(2**125))),
        (2, 20, "-128.00"),  # one byte: 0x80 (two's complement)
        (2, 20, "1.28"),  # two bytes: 0x00 0x80
    ],
)
def test_decimals_read_base64_two_complement(scale: int, precision: int | None, value: str) -> None:
    of = struct(field("d", cg.decimal_schema(scale, precision)))
    codec = ConnectJsonCodec()
    (shape,) = declared(codec, envelope(of, {"d": decimal.Decimal(value)}))
    type_ = codec.iceberg_type(shape, None)
    assert isinstance(type_, StructType)
    assert type_.fields[0].field_type == DecimalType(precision or 38, scale)
    values, errors = decode(of, {"d": decimal.Decimal(value)})
    assert errors == [None]
    assert values[0]["d"] == decimal.Decimal(value)
    assert values[0]["d"].as_tuple().exponent == -scale


def test_decimals_written_as_numbers_are_read_exactly() -> None:
    """``decimal.format=NUMERIC`` writes a Decimal as a JSON number: read without going through
    a float, and refused when it has more decimal places than the scale allows."""
    of = struct(field("d", cg.decimal_schema(2, 38)), field("f", schema("double", optional=True)))
    head = b'{"schema":' + json.dumps(of, separators=(",", ":")).encode() + b',"payload":'
    texts = [
        head + b'{"d":12345678901234567890123456789012.34,"f":0.1}}',
        head + b'{"d":-7,"f":null}}',
        head + b'{"d":1.50}}',
        head + b'{"d":1.234}}',
        head + b'{"d":123456789012345678901234567890123456789}}',  # beyond 64 bits
    ]
    codec = ConnectJsonCodec()
    (shape,) = declared(codec, *texts)
    got = codec.decode(shape, binary(*texts))
    values = got.values.to_pylist()
    assert values[0] == {"d": decimal.Decimal("12345678901234567890123456789012.34"), "f": 0.1}
    assert values[1]["d"] == decimal.Decimal("-7.00") and values[2]["d"] == decimal.Decimal("1.5")
    assert got.errors[:3] == [None, None, None]
    assert got.errors[3] == "field d: 1.234 has more decimal places than decimal(38, 2)"
    assert got.errors[4] is not None and "has more digits than decimal(38, 2)" in got.errors[4]


def test_a_decimal_wider_than_its_precision_fails_its_row() -> None:
    of = struct(field("d", cg.decimal_schema(2, 4)))
    text = b'{"schema":%s,"payload":{"d":"%s"}}' % (
        json.dumps(of).encode(),
        cg.b64(cg.unscaled_bytes(123456)).encode(),
    )
    codec = ConnectJsonCodec()
    (shape,) = declared(codec, text)
    got = codec.decode(shape, binary(text))
    assert got.values.to_pylist() == [None]
    assert got.errors == ["field d: 1234.56 has more digits than decimal(4, 2)"]


def test_decimals_iceberg_cannot_hold_are_refused() -> None:
    codec = ConnectJsonCodec()
    for of, why in [
        (cg.decimal_schema(2, 39), "wider than Iceberg's 38 digits"),
        (cg.decimal_schema(40), "needs 0 <= scale <= precision"),
        (schema("bytes", name=cg.DECIMAL), "no integer parameter 'scale'"),
    ]:
        (shape,) = declared(codec, envelope(struct(field("d", of)), {"d": None}))
        with pytest.raises(SchemaNotExpressible, match=why):
            codec.iceberg_type(shape, None)


def test_schemas_iceberg_cannot_hold_keep_their_rows_raw_with_the_cause() -> None:
    deep: dict[str, Any] = schema("int32")
    for _ in range(70):
        deep = schema("array", items=deep)
    codec = ConnectJsonCodec()
    for of, why in [
        (deep, "nested more than 64 deep"),
        (struct(), "has no fields"),
        (schema("map", keys=struct(field("a", schema("int32"))), values=schema("int32")),
         "only primitive keys"),
        (schema("timestamp"), "no Connect type: 'timestamp'"),
    ]:  # fmt: skip
        (shape,) = declared(codec, envelope(of, None))
        with pytest.raises(SchemaNotExpressible, match=why):
            codec.iceberg_type(shape, None)
    wide = struct(field("d", cg.decimal_schema(2, 39)))
    values = [envelope(PERSON, {"id": 1}), envelope(wide, {"d": None})]
    table = typed_rows(rows(values)).decode(rows(values)).table
    error = table.column(VALUE_ERROR_COLUMN).to_pylist()[1]
    assert error is not None and "cannot be columns" in error and "38 digits" in error
    assert table.column("kafka_value").to_pylist() == values


def test_decimal_text_is_exact_and_plain() -> None:
    assert decimal_text(-5, 3) == "-0.005"
    assert decimal_text(12, -2) == "1200"
    assert decimal_text(0, 2) == "0.00"
    assert decimal_text(123456789012345678901234567890123456789012, 40) == (
        "12.3456789012345678901234567890123456789012"
    )


# --------------------------------------------------------------------------- envelopes

PERSON = struct(
    field("id", schema("int32")),
    field("name", schema("string", optional=True)),
    name="shop.public.person.Value",
)


def test_a_null_payload_is_a_null_value_not_an_error() -> None:
    values, errors = decode(PERSON, {"id": 1, "name": "a"}, None)
    assert values == [{"id": 1, "name": "a"}, None] and errors == [None, None]


def test_values_that_are_not_envelopes_fail_with_the_cause() -> None:
    codec = ConnectJsonCodec()
    schema_text = json.dumps(PERSON)
    values = [
        b"[1,2]",
        b'{"id":1,"name":"plain json"}',
        b'{"schema":' + schema_text.encode() + b"}",
        b'{"schema":' + schema_text.encode() + b',"payload":{"id":1},"extra":1}',
        b'{"schema":null,"payload":{"id":1}}',
        b'{"schema":"text","payload":{"id":1}}',
        b"{oops",
        b"\xff\xfe",
        None,  # a tombstone: no shape, no error
    ]
    found = codec.shapes(binary(*values), None, SUBJECT)
    # JSON without an envelope is read as the json codec reads plain JSON: an array is no
    # object; objects get plain shapes (schema type JSON)
    assert found.errors[0] == "value: not a JSON object but an array"
    assert found.errors[1] is None and found.errors[2] is None
    plain = {s.schema_id: s for s in found.schemas if s.schema_type == "JSON"}
    assert set(plain) == {found.ids[1], found.ids[2]}
    # its schema is read at once (so the row has the schema's id, as a framed value that does
    # not decode has its id); decoding it finds the extra key
    extra = f"{NOT_AN_ENVELOPE}: an object with other keys too: ['extra']"
    assert found.errors[3] is None and found.ids[3] > 0
    assert codec.decode(found.schemas[0], binary(values[3])).errors == [extra]
    assert found.errors[4] is not None and "without a schema (schema: null)" in found.errors[4]
    assert found.errors[5] == f"{NOT_AN_ENVELOPE}: its schema is not an object"
    assert found.errors[6] is not None and found.errors[6].startswith("corrupt payload:")
    assert found.errors[7] is not None and found.errors[7].startswith("corrupt payload: not UTF-8")
    assert found.errors[8] is None
    assert found.ids.tolist() == [-1, found.ids[1], found.ids[2], found.ids[3]] + [-1] * 5


def test_the_schema_id_is_the_canonical_schemas_not_its_spelling() -> None:
    """Another key order or spacing of one schema is the same shape; rows of any spelling
    decode alike (the fast path and the full parse agree)."""
    codec = ConnectJsonCodec()
    compact = envelope(PERSON, {"id": 1, "name": "a"})
    reordered = {k: PERSON[k] for k in reversed(list(PERSON))}
    spaced = json.dumps({"payload": {"name": "b", "id": 2}, "schema": reordered}, indent=1)
    found = codec.shapes(binary(compact, spaced.encode()), None, SUBJECT)
    (shape,) = found.schemas
    assert found.ids.tolist() == [shape.schema_id] * 2
    canonical = json.dumps(PERSON, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert shape.schema == canonical and shape.schema_id == schema_id(canonical)
    assert shape.schema_type == "CONNECT" and shape.subject == SUBJECT and shape.version is None
    assert 0 < shape.schema_id < 2**31
    got = codec.decode(shape, binary(compact, spaced.encode()))
    assert got.values.to_pylist() == [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]
    # a fresh codec (a worker that never saw these texts) finds the same
    assert ConnectJsonCodec().shapes(binary(spaced.encode()), None, SUBJECT).schemas == [shape]


def test_a_row_of_another_schema_is_refused_by_decode() -> None:
    codec = ConnectJsonCodec()
    other = struct(field("id", schema("int64")))
    (person,) = declared(codec, envelope(PERSON, {"id": 1}))
    (_,) = declared(codec, envelope(other, {"id": 1}))
    got = codec.decode(person, binary(envelope(other, {"id": 1})))
    assert got.errors[0] is not None and "the envelope's schema has id" in got.errors[0]


def test_a_payload_key_inside_the_schema_does_not_mislead_the_fast_path() -> None:
    """A default holding ``,"payload":`` inside the schema: the row is read whole."""
    tricky = struct(field("meta", schema("map", keys=schema("string"), values=schema("int32"),
                                         default={"a": 1, "payload": 2})))  # fmt: skip
    codec = ConnectJsonCodec()
    text = envelope(tricky, {"meta": [("x", 5)]})
    assert text.count(b',"payload":') == 2
    (shape,) = declared(codec, text)
    assert codec.decode(shape, binary(text)).values.to_pylist() == [{"meta": [("x", 5)]}]


def test_shapes_telling_rows_and_kinds() -> None:
    codec = ConnectJsonCodec(max_schemas=2)
    one, two = PERSON, struct(field("id", schema("int64")))
    three = struct(field("id", schema("string")))
    values = binary(
        envelope(one, {"id": 1}),
        None,
        envelope(one, {"id": 2}),
        envelope(two, {"id": 3}),
        b"[]",
        envelope(three, {"id": "4"}),
        envelope(two, {"id": 5}),
    )
    found = codec.shapes(values, None, SUBJECT)
    first, second = (s.schema_id for s in found.schemas)
    assert found.ids.tolist() == [first, -1, first, second, -1, -1, second]
    assert found.errors[5] == (
        "more than 2 distinct Connect schemas in one batch: this one is kept as bytes"
    )
    assert codec.telling_rows(values).tolist() == [0, 3]
    assert codec.telling_rows(values, telling=True).tolist() == [0, 3, 5]
    assert len(codec.shapes(values, None, SUBJECT, telling=True).schemas) == 3
    joined = codec.joined_kinds(values)
    third = schema_id(json.dumps(three, sort_keys=True, separators=(",", ":")))
    assert set(joined) == {str(first), str(second), str(third)}
    assert codec.within_kinds(binary(envelope(two, {"id": 9})), joined)
    assert not codec.within_kinds(binary(envelope(one, {"id": 9})), codec.joined_kinds(
        binary(envelope(two, {"id": 1}))))  # fmt: skip
    # the declarations do not depend on the table's columns or the window
    again = codec.shapes(values, {"id": LongType()}, SUBJECT, window=True)
    assert again.ids.tolist() == found.ids.tolist() and again.schemas == found.schemas


def test_the_codec_pickles_and_never_reencodes() -> None:
    codec = ConnectJsonCodec()
    text = envelope(PERSON, {"id": 1, "name": "a"})
    (shape,) = declared(codec, text)
    again = pickle.loads(pickle.dumps(codec))
    assert again.decode(shape, binary(text)).values.to_pylist() == [{"id": 1, "name": "a"}]
    with pytest.raises(NotImplementedError, match="never re-encoded"):
        codec.encode(shape, codec.decode(shape, binary(text)).values)


def test_it_is_registered_without_a_registry() -> None:
    registry = load_registry()
    registration = registry.get(CODEC_KIND, "connect-json")
    assert registration.needs_registry is False
    codecs = CodecsSettings.model_validate(
        {"topics": [{"match": "dbserver1.*", "value": "connect-json", "key": "connect-json"}]}
    )
    assert check_codecs(codecs, registry) == []


# --------------------------------------------------------------------------- typed rows


def codecs(*, keys: bool = False) -> TopicCodecs:
    codec = ConnectJsonCodec()
    by_type = dict.fromkeys(codec.schema_types, codec)  # as the codecs: section maps them
    key = SideCodecs(by_type, "t-key") if keys else None
    return TopicCodecs("t", SideCodecs(by_type, SUBJECT), key)


def rows(values: list[bytes | None], keys: list[bytes | None] | None = None) -> pa.Table:
    count = len(values)
    return pa.Table.from_pydict(
        {
            "kafka_partition": [0] * count,
            "kafka_offset": list(range(count)),
            "kafka_timestamp": [0] * count,
            "kafka_timestamp_type": [0] * count,
            "kafka_key": keys if keys is not None else [None] * count,
            "kafka_headers": [[]] * count,
            "kafka_value": values,
        },
        schema=ROW_ARROW_SCHEMA,
    )


def typed_rows(batch: pa.Table, *, keys: bool = False) -> TypedRows:
    """The decoder of a table folded from ``batch`` (as the pipeline's driver folds it)."""
    shaped = build_layout_of_shapes(
        ROW_SCHEMA,
        LAST_ID,
        codecs(keys=keys),
        StoredSchemas(),
        batch.column("kafka_value").combine_chunks(),
        batch.column("kafka_key").combine_chunks() if keys else None,
    )
    source = StoredSchemas().add(list(shaped.shapes.values()))
    return TypedRows(shaped.layout, codecs(keys=keys), source)


PERSON_V2 = struct(
    field("id", schema("int32")),
    field("name", schema("string", optional=True)),
    field("email", schema("string", optional=True)),
    name="shop.public.person.Value",
)


def test_envelopes_become_columns_and_keep_their_bytes() -> None:
    values = [
        envelope(PERSON, {"id": 1, "name": "Ann"}),
        envelope(PERSON, None),  # a null payload
        None,  # a tombstone
        b"[4]",  # neither an envelope nor a JSON object
        envelope(PERSON, {"id": 5, "name": None}),
    ]
    typed = typed_rows(rows(values))
    layout = typed.layout
    assert [f.name for f in layout.schema.fields][-2:] == ["id", "name"]
    assert layout.schema.find_field("id").field_type == IntegerType()
    assert not layout.schema.find_field("id").required  # every typed column is optional
    table = typed.decode(rows(values)).table
    assert table.select(["id", "name"]).to_pylist() == [
        {"id": 1, "name": "Ann"},
        {"id": None, "name": None},
        {"id": None, "name": None},
        {"id": None, "name": None},
        {"id": 5, "name": None},
    ]
    assert table.column("kafka_value").to_pylist() == values  # every envelope's bytes kept
    errors = table.column(VALUE_ERROR_COLUMN).to_pylist()
    assert errors[:3] == [None, None, None] and errors[4] is None
    assert errors[3] == "value: not a JSON object but an array"
    ids = table.column(VALUE_SCHEMA_ID_COLUMN).to_pylist()
    (shape_id,) = layout.value.schemas if layout.value else ()
    assert ids == [shape_id, shape_id, None, None, shape_id]
    # KSI's way back: the kept bytes, never a re-encoding
    _, again = typed.encode(table)
    assert again.to_pylist() == values
    properties = layout.schema_properties()
    assert json.loads(properties[f"bergstream.schema.{shape_id}"])["schemaType"] == "CONNECT"


def test_a_new_optional_field_folds_into_a_new_column_older_rows_null() -> None:
    first = [envelope(PERSON, {"id": i, "name": f"n{i}"}) for i in range(3)]
    second = [envelope(PERSON_V2, {"id": 3, "name": "n3", "email": "a@b.c"})]
    typed = typed_rows(rows(first + second))
    layout = typed.layout
    assert [f.name for f in layout.schema.fields][-3:] == ["id", "name", "email"]
    assert layout.value is not None and len(layout.value.schemas) == 2
    assert not layout.value.rejected
    table = typed.decode(rows(first + second)).table
    assert table.column("email").to_pylist() == [None, None, None, "a@b.c"]
    assert table.column("name").to_pylist() == ["n0", "n1", "n2", "n3"]
    ids = table.column(VALUE_SCHEMA_ID_COLUMN).to_pylist()
    assert ids[0] == ids[1] == ids[2] != ids[3]

    # A later batch, folded into the table the first made: the column stays where it was.
    made = layout
    later = [envelope(PERSON_V2, {"id": 4, "name": None, "email": "d@e.f"})]
    shaped = build_layout_of_shapes(
        made.schema, made.last_column_id, codecs(), StoredSchemas(), binary(*later)
    )
    assert shaped.layout.schema.as_struct() == made.schema.as_struct()


def test_a_field_changing_type_is_rejected_and_its_rows_keep_their_bytes() -> None:
    changed = struct(field("id", schema("string")), field("name", schema("string")))
    values = [envelope(PERSON, {"id": 1, "name": "a"}), envelope(changed, {"id": "x", "name": "b"})]
    typed = typed_rows(rows(values))
    assert typed.layout.value is not None and len(typed.layout.value.rejected) == 1
    table = typed.decode(rows(values)).table
    assert table.column("id").to_pylist() == [1, None]
    error = table.column(VALUE_ERROR_COLUMN).to_pylist()[1]
    assert error is not None and "does not fit the table" in error
    assert table.column("kafka_value").to_pylist() == values


def test_a_later_batch_adopts_schemas_that_fit_and_refuses_new_columns() -> None:
    made = typed_rows(rows([envelope(PERSON_V2, {"id": 1, "name": "a", "email": None})])).layout
    layout = build_layout_of_columns(made.schema, made.last_column_id, codecs(), StoredSchemas())
    assert layout is not None
    adopt = TypedRows(layout, codecs(), StoredSchemas(), adopt_shapes=True)
    got = adopt.decode(rows([envelope(PERSON, {"id": 2, "name": "b"})]))  # email left out: fits
    assert got.table.select(["id", "name", "email"]).to_pylist() == [
        {"id": 2, "name": "b", "email": None}
    ]
    assert len(got.adopted) == 1
    wider = struct(*PERSON_V2["fields"], field("age", schema("int32", optional=True)))
    with pytest.raises(ShapesToFold):
        adopt.decode(rows([envelope(wider, {"id": 3, "name": "c", "email": None, "age": 4})]))
    # without adoption the same rows wait for the fold, bytes kept
    plain = TypedRows(layout, codecs(), StoredSchemas())
    error = plain.decode(rows([envelope(PERSON, {"id": 2})])).table.column(VALUE_ERROR_COLUMN)
    assert "has not folded yet" in error.to_pylist()[0]


def test_a_batch_beyond_the_sample_it_was_folded_from_is_not_decoded() -> None:
    sample = rows([envelope(PERSON, {"id": 1, "name": "a"})])
    shaped = build_layout_of_shapes(
        ROW_SCHEMA, LAST_ID, codecs(), StoredSchemas(), sample.column("kafka_value")
    )
    joined = ConnectJsonCodec().joined_kinds(sample.column("kafka_value").combine_chunks())
    typed = TypedRows(
        shaped.layout,
        codecs(),
        StoredSchemas().add(list(shaped.shapes.values())),
        adopt_shapes=True,
        within={"value": joined},
    )
    fits = typed.decode(rows([envelope(PERSON, {"id": 2, "name": None})]))
    assert fits.table.column("id").to_pylist() == [2]
    with pytest.raises(ShapesToFold):  # a schema the sample did not have
        typed.decode(rows([envelope(PERSON_V2, {"id": 3, "name": "c", "email": "e"})]))


def test_keys_and_a_debezium_envelope_become_columns() -> None:
    row = struct(
        field("id", schema("int32")),
        field("price", cg.decimal_schema(2, 10)),
        field("created", schema("int64", optional=True, name=cg.DBZ_MICRO_TIMESTAMP)),
        name="dbserver1.inventory.products.Value",
    )
    before_after = dict(row, optional=True)
    source = struct(
        field("connector", schema("string")),
        field("ts_ms", schema("int64")),
        field("snapshot", schema("string", optional=True, name="io.debezium.data.Enum")),
        name="io.debezium.connector.postgresql.Source",
    )
    value_schema = struct(
        field("before", before_after),
        field("after", before_after),
        field("source", source),
        field("op", schema("string")),
        field("ts_ms", schema("int64", optional=True)),
        name="dbserver1.inventory.products.Envelope",
    )
    key_schema = struct(field("id", schema("int32")), name="dbserver1.inventory.products.Key")
    created = dt.datetime(2024, 5, 1, 12, 0, 0, 123456)
    after = {"id": 7, "price": decimal.Decimal("19.99"), "created": created}
    src = {"connector": "postgresql", "ts_ms": 1_700_000_000_000, "snapshot": "false"}
    values = [
        envelope(value_schema, {"after": after, "source": src, "op": "c", "ts_ms": 1}),
        envelope(value_schema, {"before": after, "source": src, "op": "d", "ts_ms": 2}),
        None,  # the tombstone Debezium writes after a delete
    ]
    keys = [envelope(key_schema, {"id": 7})] * 3
    typed = typed_rows(rows(values, keys), keys=True)
    names = [f.name for f in typed.layout.schema.fields]
    assert names[-8:] == [
        "before", "after", "source", "op", "ts_ms", KEY_SCHEMA_ID_COLUMN, KEY_ERROR_COLUMN, "key_id"
    ]  # fmt: skip
    table = typed.decode(rows(values, keys)).table.to_pylist()
    assert table[0]["after"] == after and table[0]["before"] is None and table[0]["op"] == "c"
    assert table[1]["before"] == after and table[1]["after"] is None
    assert table[0]["source"] == src
    assert [r["key_id"] for r in table] == [7, 7, 7]
    assert all(r[KEY_ERROR_COLUMN] is None and r[VALUE_ERROR_COLUMN] is None for r in table)
    assert [r["kafka_key"] for r in table] == keys  # keys keep their bytes too
    key_out, value_out = typed.encode(typed.decode(rows(values, keys)).table)
    assert key_out.to_pylist() == keys and value_out.to_pylist() == values


# --------------------------------------------------------------------------- property


@dataclass
class Case:
    """A Connect schema, its values (logical form) and what the codec decodes them to."""

    schema: dict[str, Any]
    values: st.SearchStrategy[Any]
    expect: Callable[[Any], Any]


def _same(value: Any) -> Any:
    return value


def _naive(micros_unit: int) -> st.SearchStrategy[dt.datetime]:
    return st.datetimes(dt.datetime(1900, 1, 1), dt.datetime(2200, 1, 1)).map(
        lambda d: d.replace(microsecond=d.microsecond // micros_unit * micros_unit)
    )


def _variable_text(value: decimal.Decimal) -> str:
    sign, digits, exponent = value.as_tuple()
    unscaled = int("".join(map(str, digits)) or "0") * (-1 if sign else 1)
    return decimal_text(unscaled, -int(exponent))


def _decimals(precision: int, scale: int) -> st.SearchStrategy[decimal.Decimal]:
    bound = 10**precision - 1
    exact = decimal.Context(prec=100)
    return st.integers(-bound, bound).map(lambda u: decimal.Decimal(u).scaleb(-scale, exact))


@st.composite
def leaf_case(draw: st.DrawFn) -> Case:
    kind = draw(st.sampled_from(sorted(_LEAVES)))
    if kind == "decimal":
        precision = draw(st.integers(1, 38))
        scale = draw(st.integers(0, precision))
        given_precision = draw(st.sampled_from([precision, None])) if precision == 38 else precision
        of = cg.decimal_schema(scale, given_precision, optional=False)
        return Case(of, _decimals(precision, scale), _same)
    type_, name, values, expect = _LEAVES[kind]
    if name == cg.DBZ_VARIABLE_SCALE_DECIMAL:
        return Case(cg.variable_decimal_schema(optional=False), values, expect)
    return Case(schema(type_, name=name), values, expect)


_ZONES = st.integers(-14 * 60, 14 * 60).map(lambda m: dt.timezone(dt.timedelta(minutes=m)))
_LEAVES: dict[str, tuple[str, str | None, st.SearchStrategy[Any], Callable[[Any], Any]]] = {
    "int8": ("int8", None, st.integers(-(2**7), 2**7 - 1), _same),
    "int16": ("int16", None, st.integers(-(2**15), 2**15 - 1), _same),
    "int32": ("int32", None, st.integers(-(2**31), 2**31 - 1), _same),
    "int64": ("int64", None, st.integers(-(2**63), 2**63 - 1), _same),
    "float32": ("float", None, st.floats(width=32, allow_nan=False, allow_infinity=False), _same),
    "float64": ("double", None, st.floats(allow_nan=False, allow_infinity=False), _same),
    "boolean": ("boolean", None, st.booleans(), _same),
    "string": ("string", None, st.text(max_size=8), _same),
    "bytes": ("bytes", None, st.binary(max_size=8), _same),
    "decimal": ("bytes", cg.DECIMAL, st.nothing(), _same),  # see leaf_case
    "date": ("int32", cg.DATE, st.dates(), _same),
    "time": ("int32", cg.TIME, st.integers(0, 86_399_999).map(lambda ms: ms * 1000), _same),
    "timestamp": (
        "int64",
        cg.TIMESTAMP,
        _naive(1000).map(lambda d: d.replace(tzinfo=dt.UTC)),
        _same,
    ),
    "dbz_date": ("int32", cg.DBZ_DATE, st.dates(), _same),
    "dbz_time": ("int32", cg.DBZ_TIME, st.integers(0, 86_399_999).map(lambda ms: ms * 1000), _same),
    "dbz_micro_time": ("int64", cg.DBZ_MICRO_TIME, st.integers(0, 86_399_999_999), _same),
    "dbz_nano_time": ("int64", cg.DBZ_NANO_TIME, st.integers(0, 86_399_999_999), _same),
    "dbz_timestamp": ("int64", cg.DBZ_TIMESTAMP, _naive(1000), _same),
    "dbz_micro_timestamp": ("int64", cg.DBZ_MICRO_TIMESTAMP, _naive(1), _same),
    "dbz_nano_timestamp": ("int64", cg.DBZ_NANO_TIMESTAMP, _naive(1), _same),
    "dbz_zoned_timestamp": (
        "string",
        cg.DBZ_ZONED_TIMESTAMP,
        st.builds(lambda d, z: d.replace(tzinfo=z), _naive(1), _ZONES),
        _same,
    ),
    "dbz_json": ("string", cg.DBZ_JSON, st.text(max_size=8), _same),
    "dbz_uuid": ("string", cg.DBZ_UUID, st.uuids(), _same),
    "dbz_variable_decimal": (
        "struct",
        cg.DBZ_VARIABLE_SCALE_DECIMAL,
        st.builds(
            lambda u, s: decimal.Decimal((int(u < 0), tuple(map(int, str(abs(u)))), -s)),
            st.integers(-(10**40), 10**40),
            st.integers(-5, 20),
        ),
        _variable_text,
    ),
}


def _optional(case: Case, optional: bool) -> Case:
    if not optional:
        return case
    of = dict(case.schema, optional=True)
    return Case(of, st.none() | case.values, lambda v: None if v is None else case.expect(v))


@st.composite
def any_case(draw: st.DrawFn, depth: int = 2) -> Case:
    kind = draw(st.sampled_from(["leaf"] * 3 + (["array", "map", "struct"] if depth else [])))
    if kind == "leaf":
        case = draw(leaf_case())
    elif kind == "array":
        item = draw(any_case(depth - 1))
        case = Case(
            schema("array", items=item.schema),
            st.lists(item.values, max_size=3),
            lambda v, e=item.expect: [e(x) for x in v],
        )
    elif kind == "map":
        string_keys = draw(st.booleans())
        keys = schema("string") if string_keys else schema("int32")
        key_values = st.text(max_size=4) if string_keys else st.integers(-(2**31), 2**31 - 1)
        item = draw(any_case(depth - 1))
        case = Case(
            schema("map", keys=keys, values=item.schema),
            st.lists(st.tuples(key_values, item.values), max_size=3, unique_by=lambda kv: kv[0]),
            lambda v, e=item.expect: [(k, e(x)) for k, x in v],
        )
    else:
        case = draw(struct_case(depth - 1))
    return _optional(case, draw(st.booleans()))


@st.composite
def struct_case(draw: st.DrawFn, depth: int = 2) -> Case:
    count = draw(st.integers(1, 4))
    children = [draw(any_case(depth)) for _ in range(count)]
    names = [f"f{i}" for i in range(count)]
    of = struct(*(field(n, c.schema) for n, c in zip(names, children, strict=True)))
    values = st.fixed_dictionaries({n: c.values for n, c in zip(names, children, strict=True)})

    def expect(value: dict[str, Any]) -> dict[str, Any]:
        return {n: c.expect(value[n]) for n, c in zip(names, children, strict=True)}

    return Case(of, values, expect)


@settings(
    max_examples=int(__import__("os").environ.get("CONNECT_JSON_EXAMPLES", "80")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.one_of(struct_case(), any_case(1)), st.data())
def test_random_schemas_and_values_decode_back_to_what_was_written(
    case: Case, data: st.DataObject
) -> None:
    """Random Connect schemas (every type above, nested) and values, written as JsonConverter
    writes them, decode to the values written; through typed rows too, when the payload is a
    struct (its fields as columns)."""
    values = data.draw(st.lists(case.values, min_size=1, max_size=4))
    codec = ConnectJsonCodec()
    texts = [envelope(case.schema, v) for v in values] + [envelope(case.schema, None)]
    payloads = binary(*texts)
    found = codec.shapes(payloads, None, SUBJECT)
    (shape,) = found.schemas
    assert found.errors == [None] * len(texts)
    got = codec.decode(shape, payloads)
    assert got.errors == [None] * len(texts)
    assert got.values.type == codec.arrow_type(shape)
    assert got.values.to_pylist() == [*(case.expect(v) for v in values), None]
    assert bool(np.all(got.keep_bytes))
    if case.schema["type"] == "struct" and case.schema.get("name") is None:
        typed = typed_rows(rows(texts))
        table = typed.decode(rows(texts)).table
        expected = [case.expect(v) for v in values]
        for name in (f["field"] for f in case.schema["fields"]):
            want = [None if row is None else row[name] for row in expected]
            assert table.column(name).to_pylist() == [*want, None]
        assert table.column("kafka_value").to_pylist() == texts


def test_json_without_envelopes_reads_as_plain_json() -> None:
    """What JsonConverter writes with schemas.enable=false: the json codec's rules (columns
    from the data, canonical text re-encoded), beside envelopes of another topic's converter."""
    values = [b'{"id":1,"name":"Ann"}', b'{"id":2,"name":"Bo"}', None]
    typed = typed_rows(rows(values))
    layout = typed.layout
    assert [f.name for f in layout.schema.fields][-2:] == ["id", "name"]
    table = typed.decode(rows(values)).table
    assert table.select(["id", "name"]).to_pylist() == [
        {"id": 1, "name": "Ann"},
        {"id": 2, "name": "Bo"},
        {"id": None, "name": None},
    ]
    assert table.column(VALUE_ERROR_COLUMN).to_pylist() == [None, None, None]
    # canonical plain JSON keeps no bytes, and re-encodes to the very bytes
    assert table.column("kafka_value").to_pylist() == [None, None, None]
    _, again = typed.encode(table)
    assert again.to_pylist() == values
    (shape,) = layout.value.schemas.values() if layout.value else ()
    assert shape.schema_type == "JSON"
