"""Hand-made payloads: non-canonical encodings decode to the canonical values with
``keep_bytes`` set, undecodable ones give a null row and their cause, and neither disturbs the
rows around them."""

from __future__ import annotations

import datetime
import decimal
import json
import uuid
from typing import Any

import pyarrow as pa
import pytest

from bergstream.core.api import RegisteredSchema
from bergstream.plugins.value_codecs.avro.codec import AvroCodec

CODEC = AvroCodec()


def _schema(type_: Any) -> RegisteredSchema:
    record = {"type": "record", "name": "R", "fields": [{"name": "v", "type": type_}]}
    return RegisteredSchema(7, "AVRO", json.dumps(record))


def _decode(type_: Any, *payloads: bytes) -> tuple[list[Any], list[bool], list[str | None]]:
    decoded = CODEC.decode(_schema(type_), pa.array(payloads, pa.large_binary()))
    decoded.values.validate(full=True)
    values = [None if row is None else row["v"] for row in decoded.values.to_pylist()]
    return values, decoded.keep_bytes.tolist(), decoded.errors


def _encode(type_: Any, payloads: list[bytes]) -> list[bytes]:
    schema = _schema(type_)
    decoded = CODEC.decode(schema, pa.array(payloads, pa.large_binary()))
    return CODEC.encode(schema, decoded.values).to_pylist()


DECIMAL = {"type": "bytes", "logicalType": "decimal", "precision": 5, "scale": 2}
UUID_TYPE = {"type": "string", "logicalType": "uuid"}
SAMPLE_UUID = "0f8fad5b-d9cb-469f-a165-70867728950e"

# (schema, non-canonical payload, its value, the canonical payload)
NON_CANONICAL = [
    pytest.param("long", b"\x82\x00", 1, b"\x02", id="non-minimal varint"),
    pytest.param("int", b"\x80\x80\x00", 0, b"\x00", id="non-minimal int"),
    pytest.param("boolean", b"\x02", True, b"\x01", id="boolean 2"),
    pytest.param("string", b"\x86\x00abc", "abc", b"\x06abc", id="non-minimal length"),
    pytest.param(
        {"type": "array", "items": "int"},
        b"\x02\x02\x02\x04\x00",
        [1, 2],
        b"\x04\x02\x04\x00",
        id="array in two blocks",
    ),
    pytest.param(
        {"type": "array", "items": "int"},
        b"\x03\x04\x02\x04\x00",
        [1, 2],
        b"\x04\x02\x04\x00",
        id="array block with negative count",
    ),
    pytest.param(
        {"type": "map", "values": "int"},
        b"\x04\x02a\x02\x02b\x04\x00",
        [("a", 1), ("b", 2)],
        b"\x04\x02a\x02\x02b\x04\x00",
        id="canonical map",
    ),
    pytest.param(
        {"type": "map", "values": "int"},
        b"\x06\x02a\x02\x02b\x04\x02a\x06\x00",
        [("b", 2), ("a", 3)],
        b"\x04\x02b\x04\x02a\x06\x00",
        id="duplicate map key, last wins",
    ),
    pytest.param(
        DECIMAL,
        b"\x04\x00\x05",
        decimal.Decimal("0.05"),
        b"\x02\x05",
        id="decimal with a redundant sign byte",
    ),
    pytest.param(DECIMAL, b"\x00", decimal.Decimal("0.00"), b"\x02\x00", id="empty decimal"),
    pytest.param(
        UUID_TYPE,
        b"\x48" + SAMPLE_UUID.upper().encode(),
        uuid.UUID(SAMPLE_UUID),
        b"\x48" + SAMPLE_UUID.encode(),
        id="uppercase uuid",
    ),
    pytest.param(
        UUID_TYPE,
        b"\x40" + SAMPLE_UUID.replace("-", "").encode(),
        uuid.UUID(SAMPLE_UUID),
        b"\x48" + SAMPLE_UUID.encode(),
        id="uuid without hyphens",
    ),
    pytest.param(
        UUID_TYPE,
        b"\x5a" + f"urn:uuid:{SAMPLE_UUID}".encode(),
        uuid.UUID(SAMPLE_UUID),
        b"\x48" + SAMPLE_UUID.encode(),
        id="uuid urn",
    ),
    pytest.param(
        UUID_TYPE,
        b"\x4c" + f"{{{SAMPLE_UUID}}}".encode(),
        uuid.UUID(SAMPLE_UUID),
        b"\x48" + SAMPLE_UUID.encode(),
        id="uuid in braces",
    ),
    pytest.param(["null", "long"], b"\x82\x00\x02", 1, b"\x02\x02", id="non-minimal union index"),
]


@pytest.mark.parametrize(("type_", "payload", "value", "canonical"), NON_CANONICAL)
def test_non_canonical_keeps_bytes(
    type_: Any, payload: bytes, value: Any, canonical: bytes
) -> None:
    values, keep, errors = _decode(type_, payload, canonical)
    assert errors == [None, None]
    assert values == [value, value]
    assert keep == [payload != canonical, False]
    assert _encode(type_, [payload, canonical]) == [canonical, canonical]


def test_decimal_canonical_length_is_fastavros() -> None:
    # fastavro (so confluent-kafka's Python serializer) writes -128 in two bytes, Java in one:
    # the codec calls fastavro's form canonical, so Java's is kept byte for byte.
    values, keep, errors = _decode(DECIMAL, b"\x04\xff\x80", b"\x02\x80")
    assert values == [decimal.Decimal("-1.28")] * 2 and errors == [None, None]
    assert keep == [False, True]


def test_general_union_keeps_the_written_branch() -> None:
    # fastavro reads both as the same int; the codec's struct says which branch was written,
    # so re-encoding gives the original bytes.
    payloads = [b"\x00\x0a", b"\x02\x0a"]
    values, keep, errors = _decode(["int", "long"], *payloads)
    assert values == [{"int": 5, "long": None}, {"int": None, "long": 5}]
    assert keep == [False, False] and errors == [None, None]
    assert _encode(["int", "long"], payloads) == payloads


def test_float_bits_round_trip() -> None:
    nan = b"\x01\x00\xc0\x7f"  # a NaN with a payload
    _, keep, errors = _decode("float", nan)
    assert keep == [False] and errors == [None]
    assert _encode("float", [nan]) == [nan]


def test_big_maps_find_duplicates() -> None:
    entries = [f"k{i % 90}".encode() for i in range(100)]  # 10 keys appear twice
    body = b"".join(bytes([len(k) * 2]) + k + bytes([(i * 2) % 128]) for i, k in enumerate(entries))
    payload = b"\xc8\x01" + body + b"\x00"
    values, keep, errors = _decode({"type": "map", "values": "int"}, payload)
    assert errors == [None] and keep == [True]
    assert len(values[0]) == 90
    assert dict(values[0])["k0"] == 90 % 64  # entry i holds i % 64; the last "k0" is entry 90


ERROR_CASES = [
    pytest.param("long", b"", "corrupt payload: truncated", id="empty"),
    pytest.param("string", b"\x08ab", "corrupt payload: truncated", id="string past the end"),
    pytest.param("long", b"\x02\x00", "trailing bytes after the record", id="trailing"),
    pytest.param(
        "long",
        b"\xff" * 10 + b"\x01",
        "corrupt payload: a varint longer than 64 bits",
        id="varint too long",
    ),
    pytest.param("string", b"\x01", "corrupt payload: negative length", id="negative length"),
    pytest.param(
        ["null", "int"], b"\x04\x02", "corrupt payload: union branch out of range", id="union index"
    ),
    pytest.param(
        {"type": "enum", "name": "E", "symbols": ["A"]},
        b"\x02",
        "corrupt payload: enum symbol out of range",
        id="enum index",
    ),
    pytest.param("string", b"\x04\xc3\x28", "invalid UTF-8 in a string", id="bad utf-8"),
    pytest.param("string", b"\x06\xed\xa0\x80", "invalid UTF-8 in a string", id="surrogate"),
    pytest.param("string", b"\x04\xc0\xaf", "invalid UTF-8 in a string", id="overlong"),
    pytest.param(
        "int",
        b"\x80\x80\x80\x80\x10",
        "corrupt payload: an int out of the 32-bit range",
        id="int range",
    ),
    pytest.param(
        {"type": "long", "logicalType": "timestamp-millis"},
        b"\xfe\xff\xff\xff\xff\xff\xff\xff\xff\x01",
        "value does not fit: timestamp-millis beyond the microsecond range",
        id="timestamp overflow",
    ),
    pytest.param(
        DECIMAL,
        b"\x06\x01\x86\xa0",
        "value does not fit: decimal wider than its precision",
        id="decimal precision",
    ),
    pytest.param(
        {"type": "fixed", "name": "F", "size": 3, "logicalType": "decimal", "precision": 2},
        b"\x00\x00\x64",
        "value does not fit: decimal wider than its precision",
        id="fixed decimal",
    ),
    pytest.param(
        UUID_TYPE,
        b"\x48" + SAMPLE_UUID.replace("-", "x").encode(),
        "value does not fit: a uuid string that is not a UUID",
        id="uuid dashes",
    ),
    pytest.param(
        UUID_TYPE,
        b"\x46" + SAMPLE_UUID[:-1].encode(),
        "value does not fit: a uuid string that is not a UUID",
        id="uuid length",
    ),
    pytest.param(
        {"type": "array", "items": "long"},
        b"\x80\x01\x00",
        "corrupt payload: block count larger than the payload",
        id="block count",
    ),
]


@pytest.mark.parametrize(("type_", "payload", "cause"), ERROR_CASES)
def test_undecodable_rows_are_null_with_their_cause(type_: Any, payload: bytes, cause: str) -> None:
    values, keep, errors = _decode(type_, payload)
    assert values == [None] and keep == [True] and errors == [cause]


def test_empty_batch() -> None:
    values, keep, errors = _decode("long")
    assert values == [] and keep == [] and errors == []
    assert _encode("long", []) == []


def test_a_failed_row_leaves_no_partial_values() -> None:
    type_ = {
        "type": "record",
        "name": "Inner",
        "fields": [
            {"name": "tags", "type": {"type": "array", "items": "string"}},
            {"name": "n", "type": ["null", "long"]},
        ],
    }
    good = b"\x04\x02a\x02b\x00\x02\x04"  # tags [a, b], n 2
    bad = b"\x04\x02a\x02b\x00\x02"  # cut inside n
    values, keep, errors = _decode(type_, good, bad, good)
    assert values == [{"tags": ["a", "b"], "n": 2}, None, {"tags": ["a", "b"], "n": 2}]
    assert keep == [False, True, False]
    assert errors == [None, "corrupt payload: truncated", None]


def test_logical_values() -> None:
    type_ = {
        "type": "record",
        "name": "L",
        "fields": [
            {"name": "d", "type": {"type": "int", "logicalType": "date"}},
            {"name": "tm", "type": {"type": "int", "logicalType": "time-millis"}},
            {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "lt", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
            {
                "name": "u",
                "type": {"type": "fixed", "name": "U", "size": 16, "logicalType": "uuid"},
            },
        ],
    }
    u = uuid.UUID(SAMPLE_UUID)
    payload = b"\x02" + b"\xd0\x0f" + b"\xd0\x0f" + b"\x02" + u.bytes
    values, keep, errors = _decode(type_, payload)
    assert errors == [None] and keep == [False]
    assert values[0] == {
        "d": datetime.date(1970, 1, 2),
        "tm": 1_000_000,
        "ts": datetime.datetime(1970, 1, 1, 0, 0, 1, tzinfo=datetime.UTC),
        "lt": datetime.datetime(1970, 1, 1, 0, 0, 0, 1),
        "u": u,
    }
    assert _encode(type_, [payload]) == [payload]
