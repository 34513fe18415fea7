"""The ``json-schema`` value codec: JSON Schema -> Iceberg types, decoding with causes, and the
byte-exact contract (a row with ``keep_bytes`` false encodes back to its payload), by hand-made
cases and by hypothesis over generated schemas, canonical values, liberal spellings of them
(:class:`tests.kits.json_gen.LiberalWriter`) and random mutations.

``JSON_EXAMPLES`` sets the number of examples of each property test (80 by default)."""

from __future__ import annotations

import datetime as dt
import json
import os
import pickle
import re
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyiceberg.types import (
    BooleanType,
    DateType,
    DoubleType,
    IcebergType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestamptzType,
    UUIDType,
)

from bergstream.core.api import RegisteredSchema, SchemaNotExpressible, SchemaReference
from bergstream.plugins.value_codecs.json_schema.codec import JsonSchemaCodec
from bergstream.plugins.value_codecs.json_schema.types import parse_json_schema
from tests.kits.json_gen import (
    LiberalWriter,
    canonical_bytes,
    expected,
    object_schemas,
    values_of,
)

CODEC = JsonSchemaCodec()
SETTINGS = settings(
    max_examples=int(os.environ.get("JSON_EXAMPLES", "80")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _registered(schema: Any, references: tuple[SchemaReference, ...] = ()) -> RegisteredSchema:
    return RegisteredSchema(1, "JSON", json.dumps(schema), references)


def _type(schema: Any) -> IcebergType:
    return JsonSchemaCodec().iceberg_type(_registered(schema), _no_references)


def _no_references(reference: SchemaReference) -> RegisteredSchema:
    raise AssertionError(f"unexpected reference {reference}")


def _decode(schema: RegisteredSchema, payloads: list[bytes]) -> Any:
    decoded = CODEC.decode(schema, pa.array(payloads, pa.large_binary()))
    decoded.values.validate(full=True)
    assert decoded.values.type == CODEC.arrow_type(schema)
    return decoded


def _check_contract(schema: RegisteredSchema, payloads: list[bytes]) -> Any:
    """Decode, and check the contract on every row: a failed row is null with a cause and
    keeps its bytes; a decoded row keeps them exactly when encoding does not give them back."""
    decoded = _decode(schema, payloads)
    for i, payload in enumerate(payloads):
        if decoded.errors[i] is not None:
            assert decoded.keep_bytes[i] and not decoded.values[i].is_valid
        else:
            assert decoded.values[i].is_valid
            again = CODEC.encode(schema, decoded.values.slice(i, 1))[0].as_py()
            assert decoded.keep_bytes[i] == (again != payload), (payload, again)
    return decoded


# --- JSON Schema -> Iceberg type ---


def _struct(*fields: tuple[str, IcebergType, bool]) -> StructType:
    return StructType(
        *(NestedField(i, n, t, required=r) for i, (n, t, r) in enumerate(fields, start=1))
    )


@pytest.mark.parametrize(
    ("schema", "type_"),
    [
        ({"type": "integer"}, LongType()),
        ({"type": "number"}, DoubleType()),
        ({"type": "boolean"}, BooleanType()),
        ({"type": "string"}, StringType()),
        ({"type": "string", "format": "date-time"}, TimestamptzType()),
        ({"type": "string", "format": "date"}, DateType()),
        ({"type": "string", "format": "uuid"}, UUIDType()),
        ({"type": "string", "format": "email"}, StringType()),
        ({"enum": ["a", "b", None]}, StringType()),
        ({"type": "array", "items": {"type": "integer"}}, ListType(1, LongType(), True)),
        ({"type": "array", "items": {"type": ["integer", "null"]}}, ListType(1, LongType(), False)),
        (
            {"type": "object", "additionalProperties": {"type": "number"}},
            MapType(1, StringType(), 2, DoubleType(), True),
        ),
        # JSON-text rule
        ({}, StringType()),
        (True, StringType()),
        ({"type": ["string", "integer"]}, StringType()),
        ({"anyOf": [{"type": "string"}, {"type": "integer"}]}, StringType()),
        ({"allOf": [{"type": "string"}, {"maxLength": 3}]}, StringType()),
        ({"type": "array", "items": [{"type": "string"}]}, StringType()),
        ({"type": "object"}, StringType()),
        ({"type": "object", "additionalProperties": True}, StringType()),
        ({"enum": [1, "a"]}, StringType()),
        ({"type": "null"}, StringType()),
    ],
)
def test_mapping_rules(schema: Any, type_: IcebergType) -> None:
    assert _type(schema) == type_


def test_object_properties_required_and_nullable() -> None:
    schema = {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "name": {"type": ["string", "null"]},
            "note": {"type": "string"},
            "opt": {"anyOf": [{"type": "number"}, {"type": "null"}]},
            "same": {"oneOf": [{"type": "integer"}, {"type": "integer", "minimum": 3}]},
            "any": {},
        },
        "required": ["id", "name", "any", "nope"],
    }
    assert _type(schema) == _struct(
        ("id", LongType(), True),
        ("name", StringType(), False),  # required but admits null
        ("note", StringType(), False),
        ("opt", DoubleType(), False),
        ("same", LongType(), False),
        ("any", StringType(), True),  # JSON text: always there when the property is
    )


def test_field_ids_pre_order() -> None:
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "array", "items": {"type": "object", "properties": {"x": {}}}},
            "m": {"type": "object", "additionalProperties": {"type": "array", "items": {}}},
            "b": {"type": "boolean"},
        },
    }
    inner = StructType(NestedField(5, "x", StringType(), required=False))
    assert _type(schema) == StructType(
        NestedField(1, "a", ListType(4, inner, element_required=True), required=False),
        NestedField(
            2,
            "m",
            MapType(6, StringType(), 7, ListType(8, StringType(), True), True),
            required=False,
        ),
        NestedField(3, "b", BooleanType(), required=False),
    )


def test_local_refs() -> None:
    schema = {
        "type": "object",
        "properties": {
            "a": {"$ref": "#/definitions/Point"},
            "b": {"$ref": "#/$defs/Id"},
            "c": {"$ref": "#/definitions/Point/properties/x"},
            "d": {"$ref": "#/definitions/a~1b"},
        },
        "definitions": {
            "Point": {"type": "object", "properties": {"x": {"type": "number"}}},
            "a/b": {"type": "boolean"},
        },
        "$defs": {"Id": {"type": "string", "format": "uuid"}},
    }
    point = StructType(NestedField(5, "x", DoubleType(), required=False))
    assert _type(schema) == StructType(
        NestedField(1, "a", point, required=False),
        NestedField(2, "b", UUIDType(), required=False),
        NestedField(3, "c", DoubleType(), required=False),
        NestedField(4, "d", BooleanType(), required=False),
    )


def test_references_to_other_registered_schemas() -> None:
    common = RegisteredSchema(7, "JSON", json.dumps({"$defs": {"Money": {"type": "number"}}}))
    reference = SchemaReference("common.json", "common-value", 1)
    schema = _registered(
        {"type": "object", "properties": {"m": {"$ref": "common.json#/$defs/Money"}}},
        (reference,),
    )
    codec = JsonSchemaCodec()
    assert codec.iceberg_type(schema, lambda ref: common) == _struct(("m", DoubleType(), False))
    # decoding later (here, after pickling) needs no resolver: the parsed schema travels
    copy = pickle.loads(pickle.dumps(codec))
    decoded = copy.decode(schema, pa.array([b'{"m":2.5}'], pa.large_binary()))
    assert decoded.values.to_pylist() == [{"m": 2.5}] and not decoded.keep_bytes[0]


@pytest.mark.parametrize(
    ("schema", "cause"),
    [
        (
            {"type": "object", "properties": {"next": {"$ref": "#"}}},
            "property next: recursive \\$ref '#'",
        ),
        (
            {
                "type": "object",
                "properties": {"tree": {"$ref": "#/definitions/T"}},
                "definitions": {
                    "T": {
                        "type": "object",
                        "properties": {
                            "kids": {"type": "array", "items": {"$ref": "#/definitions/T"}}
                        },
                    }
                },
            },
            "property tree.kids\\[\\]: recursive",
        ),
        ({"$ref": "#/definitions/missing"}, "points to nothing"),
        ({"$ref": "other.json"}, "not a known reference"),
        ({"type": 3}, "type must be a string"),
        ({"type": "object", "properties": {"a": 3}}, "property a: a schema must be"),
    ],
)
def test_not_expressible(schema: Any, cause: str) -> None:
    with pytest.raises(SchemaNotExpressible, match=cause):
        _type(schema)


def test_not_json_and_not_a_json_schema_type() -> None:
    with pytest.raises(SchemaNotExpressible, match="not JSON"):
        JsonSchemaCodec().iceberg_type(RegisteredSchema(1, "JSON", "{oops"), _no_references)
    with pytest.raises(SchemaNotExpressible, match="not a JSON Schema"):
        JsonSchemaCodec().iceberg_type(RegisteredSchema(1, "AVRO", "{}"), _no_references)


# --- decoding and the canonical form, by hand ---

ORDER = _registered(
    {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "amount": {"type": "number"},
            "note": {"type": ["string", "null"]},
            "at": {"type": "string", "format": "date-time"},
            "day": {"type": "string", "format": "date"},
            "ref": {"type": "string", "format": "uuid"},
            "tags": {"type": "object", "additionalProperties": {"type": "string"}},
            "lines": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}},
                    "required": ["sku"],
                },
            },
            "extra": {},
        },
        "required": ["id"],
    }
)
CANONICAL = (
    '{"id":7,"amount":1.5,"note":"é\\n","at":"2024-02-03T04:05:06.000007Z","day":"2024-02-03",'
    '"ref":"12345678-1234-5678-1234-567812345678","tags":{"k":"v"},'
    '"lines":[{"sku":"a","qty":2},{"sku":"b"}],"extra":{"x":[1,null]}}'
).encode()


def test_decodes_columns() -> None:
    decoded = _check_contract(ORDER, [CANONICAL, b'{"id":1,"note":null}'])
    assert decoded.errors == [None, None] and not decoded.keep_bytes.any()
    assert decoded.values.to_pylist() == [
        {
            "id": 7,
            "amount": 1.5,
            "note": "é\n",
            "at": dt.datetime(2024, 2, 3, 4, 5, 6, 7, dt.UTC),
            "day": dt.date(2024, 2, 3),
            "ref": uuid.UUID("12345678-1234-5678-1234-567812345678"),
            "tags": [("k", "v")],
            "lines": [{"sku": "a", "qty": 2}, {"sku": "b", "qty": None}],
            "extra": '{"x":[1,null]}',
        },
        {
            "id": 1,
            "amount": None,
            "note": None,
            "at": None,
            "day": None,
            "ref": None,
            "tags": None,
            "lines": None,
            "extra": None,
        },
    ]


def _variant(old: str, new: str) -> bytes:
    assert old.encode() in CANONICAL
    return CANONICAL.replace(old.encode(), new.encode(), 1)


# Variants that decode (to the same columns or not) but must keep their bytes.
KEPT = [
    b' {"id":1,"note":null}',
    b'{"id":1,"note":null}\n',
    b'{"id": 1,"note":null}',
    b'{"note":null,"id":1}',
    b'{"id":1}',  # a null that admits null left out
    b'{"id":1,"note":null,"zz":3}',  # unknown property
    b'{"id":2,"id":1,"note":null}',  # duplicate key
    b'{"id":1.0,"note":null}',
    b'{"id":1,"note":"\\u00e9"}',
    b'{"id":1,"note":"\\/"}',
    b'{"id":1,"note":"\\u0041"}',
    b'{"id":1,"note":null,"amount":1}',
    _variant("1.5", "1.50"),
    _variant("1.5", "15e-1"),
    _variant('"amount":1.5', '"amount":1'),
    _variant("06.000007Z", "06.000007+00:00"),
    _variant("06.000007Z", "06.000007z"),
    _variant("06.000007Z", "06.0000070Z"),
    _variant("06.000007Z", "06.000000Z"),
    _variant("04:05:06.000007Z", "05:05:06.000007+01:00"),
    _variant("T04", " 04"),
    _variant("1234-567812345678", "1234-567812345ABC"),  # upper-case uuid
    _variant('{"x":[1,null]}', '{"x": [1,null]}'),
    _variant('{"x":[1,null]}', '{"x":[1e0,null]}'),
]


@pytest.mark.parametrize("payload", KEPT)
def test_non_canonical_spellings_keep_their_bytes(payload: bytes) -> None:
    decoded = _check_contract(ORDER, [payload])
    assert decoded.errors == [None], decoded.errors
    assert decoded.keep_bytes[0], payload


def test_canonical_floats_nan_and_huge_integers() -> None:
    schema = _registered(
        {"type": "object", "properties": {"n": {"type": "number"}, "j": {}}, "required": ["n"]}
    )
    canonical = [
        b'{"n":1e-05}',  # the standard library's spelling, not orjson's
        b'{"n":1e+16}',
        b'{"n":-0.0}',
        b'{"n":NaN}',
        b'{"n":-Infinity}',
        b'{"n":1.0,"j":18446744073709551616}',
        b'{"n":1.0,"j":{"a":-92233720368547758090}}',
        b'{"n":1.0,"j":null}',
    ]
    decoded = _check_contract(schema, canonical)
    assert decoded.errors == [None] * len(canonical) and not decoded.keep_bytes.any()
    assert decoded.values.to_pylist()[5]["j"] == "18446744073709551616"
    kept = [b'{"n":0.00001}', b'{"n":1e-7}', b'{"n":1e400}', b'{"n":1,"j":1.0e2}']
    decoded = _check_contract(schema, kept)
    assert decoded.errors == [None] * len(kept) and decoded.keep_bytes.all()


@pytest.mark.parametrize(
    ("payload", "cause"),
    [
        (b'{"id":"7"}', "field id: expected integer, got string"),
        (b'{"id":true}', "field id: expected integer, got boolean"),
        (b'{"id":1.5}', "field id: expected integer, got number"),
        (b'{"id":9223372036854775808}', "field id: integer out of the 64-bit range"),
        (b'{"note":"x"}', "field id: required property missing"),
        (b'{"id":1,"amount":"1"}', "field amount: expected number, got string"),
        (b'{"id":1,"at":null}', "field at: expected date-time string, got null"),
        (b'{"id":1,"at":"2024-02-03"}', "field at: not an RFC 3339 date-time"),
        (b'{"id":1,"at":"2024-02-30T00:00:00Z"}', "field at: not a valid date-time"),
        (b'{"id":1,"day":"2024-13-01"}', "field day: not a valid date"),
        (b'{"id":1,"ref":"{12345678-1234-5678-1234-567812345678}"}', "field ref: not a uuid"),
        (b'{"id":1,"tags":{"a":"b","c":1}}', 'field tags\\["c"\\]: expected string, got integer'),
        (b'{"id":1,"lines":[{"sku":"a"},{"qty":1}]}', "field lines\\[1\\].sku: required"),
        (b'{"id":1,"lines":{}}', "field lines: expected array, got object"),
        (b"[1]", "value: expected object, got array"),
        (b"null", "value: expected object, got null"),
        (b'"x"', "value: expected object, got string"),
        (b'{"id":1} x', "trailing bytes after the JSON value"),
        (b'{"id":1}{}', "trailing bytes"),
        (b'{"id":1', "corrupt payload"),
        (b"", "corrupt payload"),
        (b'{"id":1,"note":"\xff"}', "corrupt payload: not UTF-8"),
        (b'\xef\xbb\xbf{"id":1}', "corrupt payload"),  # a byte order mark
        (b'{"id":1,"note":"\\ud800"}', "lone surrogate"),
        (b"[" * 100000 + b"]" * 100000, "corrupt payload"),
    ],
)
def test_bad_payloads_fail_with_a_cause(payload: bytes, cause: str) -> None:
    decoded = _check_contract(ORDER, [CANONICAL, payload, CANONICAL])
    assert decoded.errors[0] is None and decoded.errors[2] is None
    assert decoded.errors[1] is not None and re.search(cause, decoded.errors[1]), decoded.errors

    assert decoded.values.to_pylist()[0] == decoded.values.to_pylist()[2]


def test_nullable_root_and_json_text_root() -> None:
    schema = _registered({"type": ["object", "null"], "properties": {"a": {"type": "integer"}}})
    decoded = _check_contract(schema, [b"null", b'{"a":1}'])
    assert decoded.errors[0] == "value: the payload is JSON null" and decoded.errors[1] is None
    anything = _registered({"description": "anything"})
    decoded = _check_contract(anything, [b"null", b'[1,{"a":"\xc3\xa9"}]', b"[1, 2]"])
    assert decoded.values.to_pylist() == ["null", '[1,{"a":"é"}]', "[1,2]"]
    assert decoded.keep_bytes.tolist() == [False, False, True]


def test_framed_sliced_chunked_and_small_binary_inputs() -> None:
    payloads = [CANONICAL, b'{"id":1}', b'{"id":2,"note":null}'] * 5
    whole = pa.array(payloads, pa.binary())
    sliced = CODEC.decode(ORDER, whole.slice(4, 7))
    assert sliced.values.to_pylist() == _decode(ORDER, payloads[4:11]).values.to_pylist()
    chunked = CODEC.decode(ORDER, pa.chunked_array([whole.slice(0, 3), whole.slice(3)]))
    assert chunked.keep_bytes.tolist() == [False, True, False] * 5
    framed = pa.array([b"\0\0\0\0\1" + p for p in payloads], pa.large_binary()).slice(2)
    decoded = CODEC.decode_framed(ORDER, framed, 5)
    assert decoded.values.to_pylist() == chunked.values.to_pylist()[2:]
    assert decoded.keep_bytes.tolist() == chunked.keep_bytes.tolist()[2:]
    empty = CODEC.decode(ORDER, pa.array([], pa.large_binary()))
    assert len(empty.values) == 0 and empty.errors == []
    with pytest.raises(ValueError, match="must not be null"):
        CODEC.decode(ORDER, pa.array([CANONICAL, None], pa.large_binary()))
    encoded = CODEC.encode(ORDER, pa.chunked_array([chunked.values.slice(0, 1)]))
    assert encoded.type == pa.large_binary() and encoded.to_pylist() == [CANONICAL]


def test_pickling_and_threads() -> None:
    codec = JsonSchemaCodec()
    codec.iceberg_type(ORDER, _no_references)
    copy = pickle.loads(pickle.dumps(codec))
    batch = pa.array([CANONICAL, b'{"id":"x"}'] * 200, pa.large_binary())
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: copy.decode(ORDER, batch), range(8)))
    for result in results:
        assert result.keep_bytes.tolist() == [False, True] * 200
        assert result.errors[1] == "field id: expected integer, got string"


# --- assumptions the orjson shortcut rests on ---


@SETTINGS
@given(st.text())
def test_orjson_writes_strings_like_the_standard_library(text: str) -> None:
    assert orjson.dumps(text) == json.dumps(text, ensure_ascii=False).encode()


@SETTINGS
@given(
    st.floats(min_value=1e-4, max_value=1e16, exclude_max=True)
    | st.floats(min_value=-1e16, max_value=-1e-4, exclude_min=True)
    | st.just(0.0)
    | st.just(-0.0)
)
def test_orjson_writes_mid_range_floats_like_repr(number: float) -> None:
    assert orjson.dumps(number).decode() == repr(number)


# --- property tests ---


@st.composite
def _cases(draw: st.DrawFn) -> tuple[RegisteredSchema, Any, list[Any]]:
    schema = _registered(draw(object_schemas()))
    node = parse_json_schema(schema)
    values = draw(st.lists(values_of(node), min_size=1, max_size=5))
    return schema, node, values


@SETTINGS
@given(_cases())
def test_canonical_values_decode_and_encode_back(
    case: tuple[RegisteredSchema, Any, list[Any]],
) -> None:
    schema, node, values = case
    payloads = [canonical_bytes(v) for v in values]
    decoded = _decode(schema, payloads)
    assert decoded.errors == [None] * len(values)
    assert not decoded.keep_bytes.any()
    assert decoded.values.to_pylist() == [expected(node, v) for v in values]
    assert CODEC.encode(schema, decoded.values).to_pylist() == payloads


@st.composite
def _liberal_cases(draw: st.DrawFn) -> tuple[RegisteredSchema, Any, list[Any], list[bytes]]:
    schema = _registered(draw(object_schemas()))
    node = parse_json_schema(schema)
    values = draw(st.lists(values_of(node, canonical=False), min_size=1, max_size=5))
    writer = LiberalWriter(draw)
    texts = [writer.write(node, value).encode() for value in values]
    return schema, node, values, texts


@SETTINGS
@given(_liberal_cases())
def test_liberal_spellings_decode_alike_and_keep_bytes_when_not_canonical(
    case: tuple[RegisteredSchema, Any, list[Any], list[bytes]],
) -> None:
    schema, node, values, payloads = case
    decoded = _check_contract(schema, payloads)
    assert decoded.errors == [None] * len(values)
    assert decoded.values.to_pylist() == [expected(node, v) for v in values]


@SETTINGS
@given(_cases(), st.data())
def test_mutated_payloads_fail_or_keep_the_contract(
    case: tuple[RegisteredSchema, Any, list[Any]], data: st.DataObject
) -> None:
    schema, _, values = case
    payloads = []
    for value in values:
        payload = bytearray(canonical_bytes(value))
        for _ in range(data.draw(st.integers(1, 3))):
            position = data.draw(st.integers(0, len(payload)))
            action = data.draw(st.sampled_from(["insert", "delete", "replace"]))
            byte = data.draw(st.sampled_from(b' "\\,:{}[]0123456789.eE+-nulltrfa\xc3\xa9\xff\x00'))
            if action == "insert":
                payload.insert(position, byte)
            elif position < len(payload):
                if action == "delete":
                    del payload[position]
                else:
                    payload[position] = byte
        payloads.append(bytes(payload))
    _check_contract(schema, payloads)
