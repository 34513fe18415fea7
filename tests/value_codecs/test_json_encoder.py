"""The compiled writer of the ``json-schema`` codec (:mod:`.json_encoder`): its output is byte for
byte what the Python writer (``encode_python``, the reference) gives, for values decoded from
canonical and liberal payloads of generated schemas, for Arrow values built directly, and for
edge cases (escapes, doubles, long extremes, nulls at every level, date ranges, rows the
kernel hands back to Python). Doubles are also checked against ``repr`` in bulk.

``JSON_EXAMPLES`` sets the number of examples of each property test (80 by default)."""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import uuid
from typing import Any

import numba
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bergstream.core.api import RegisteredSchema
from bergstream.plugins.value_codecs.json_schema import number_writing as json_enc_numbers
from bergstream.plugins.value_codecs.json_schema.codec import JsonSchemaCodec, _build, _Compiled
from bergstream.plugins.value_codecs.json_schema.types import parse_json_schema
from tests.kits.json_gen import (
    LiberalWriter,
    canonical_bytes,
    expected,
    object_schemas,
    values_of,
)

SETTINGS = settings(
    max_examples=int(os.environ.get("JSON_EXAMPLES", "80")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
CODEC = JsonSchemaCodec()


def _registered(schema: Any) -> RegisteredSchema:
    return RegisteredSchema(1, "JSON", json.dumps(schema), ())


def _compiled(schema: RegisteredSchema) -> _Compiled:
    return _build(parse_json_schema(schema))


def _same(compiled: _Compiled, values: pa.Array) -> list[bytes]:
    """Encode ``values`` both ways (whole, and a slice from the second row) and check the
    bytes are the same; the payloads."""
    new = compiled.encode(values)
    assert new.type == pa.large_binary()
    new.validate(full=True)
    old = compiled.encode_python(values)
    assert new.to_pylist() == old.to_pylist()
    if len(values) > 1:
        sliced = values.slice(1)
        assert compiled.encode(sliced).to_pylist() == old.to_pylist()[1:]
    return new.to_pylist()


# --- doubles: repr's spelling ---


@numba.njit(cache=False)
def _write_doubles(bits: np.ndarray, out: np.ndarray, offsets: np.ndarray) -> None:
    pos = 0
    for i in range(bits.size):
        end = json_enc_numbers.write_double(out, pos, bits[i])
        pos = pos if end < 0 else end
        offsets[i + 1] = pos


def _spell(values: np.ndarray) -> list[str | None]:
    """write_double of each value (None where it declines: subnormals)."""
    bits = np.ascontiguousarray(values, dtype=np.float64).view(np.int64)
    out = np.empty(bits.size * 25 + 8, dtype=np.uint8)
    offsets = np.zeros(bits.size + 1, dtype=np.int64)
    _write_doubles(bits, out, offsets)
    data = out.tobytes()
    texts = [data[offsets[i] : offsets[i + 1]].decode() for i in range(bits.size)]
    return [None if t == "" else t for t in texts]


def _repr(value: float) -> str | None:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value != 0 and abs(value) < 2.2250738585072014e-308:
        return None  # subnormal: the kernel hands the row to Python
    return repr(value)


def test_doubles_are_spelled_as_repr_spells_them() -> None:
    special = [1e-05, 1e16, 1e22, 1e23, 2e23, 5e-324, -0.0, 0.0, 0.1, 2.5e-7, 0.3, 1 / 3,
               math.nan, math.inf, -math.inf, 1.0, 123.456, 1e-4, 1e15, 9007199254740993.0,
               2.0**52, 2.0**53, 2.0**-1022, 1.7976931348623157e308, -1.5e300, 4.35e-308,
               123456789012345678.0, 0.30000000000000004]  # fmt: skip
    rng = np.random.default_rng(7)
    powers2 = np.array([2.0**e for e in range(-1022, 1024)])
    powers10 = np.array([float(f"1e{e}") for e in range(-307, 309)])
    edges = np.concatenate([powers2, powers10])
    samples = np.concatenate(
        [
            np.array(special),
            edges,
            np.nextafter(edges, 0),
            np.nextafter(edges, np.inf),
            rng.integers(-(2**63), 2**63 - 1, 200_000, dtype=np.int64).view(np.float64),
            rng.random(50_000) * 10.0 ** rng.integers(-12, 22, 50_000),
            np.round(rng.random(50_000) * 1000, 3),
            np.arange(1, 20_000) / 3.5,
        ]
    )
    got = _spell(samples)
    wrong = [(v, g) for v, g in zip(samples.tolist(), got, strict=True) if g != _repr(v)]
    assert not wrong, wrong[:10]


@SETTINGS
@given(st.lists(st.floats(), min_size=1, max_size=50))
def test_doubles_by_hypothesis(values: list[float]) -> None:
    assert _spell(np.array(values)) == [_repr(v) for v in values]


def test_log_approximations_are_exact_where_used() -> None:
    def floor_log10(num: int, den: int) -> int:
        e = len(str(num)) - len(str(den))
        while num * 10 ** max(-e, 0) < den * 10 ** max(e, 0):
            e -= 1
        while num * 10 ** max(-e - 1, 0) >= den * 10 ** max(e + 1, 0):
            e += 1
        return e

    for q in range(-1080, 980):
        num, den = (2**q, 1) if q >= 0 else (1, 2**-q)
        assert json_enc_numbers._flog10pow2(q) == floor_log10(num, den), q
        assert json_enc_numbers._flog10_three_quarters_pow2(q) == floor_log10(3 * num, 4 * den)
    for e in range(-330, 330):
        num, den = (10**e, 1) if e >= 0 else (1, 10**-e)
        assert json_enc_numbers._flog2pow10(e) == json_enc_numbers._floor_log2(num, den), e
        assert (num.bit_length() - 1 if e >= 0 else -den.bit_length()) == (
            json_enc_numbers._flog2pow10(e)
        )


def test_longs() -> None:
    compiled = _compiled(_registered({"type": "array", "items": {"type": "integer"}}))
    values = [0, 1, -1, 9, 10, 99, 100, -(2**63), 2**63 - 1, 10**18, 10**18 - 1, -(10**17)]
    values += [10**i for i in range(19)] + [-(10**i) + 1 for i in range(19)]
    payloads = _same(compiled, pa.array([values], compiled.arrow))
    assert payloads == [json.dumps(values, separators=(",", ":")).encode()]


# --- edge cases through the codec ---

_EDGE = _registered(
    {
        "type": "object",
        "properties": {
            "s": {"type": "string"},
            "n": {"type": ["number", "null"]},
            "req": {"type": "integer"},
            "o": {"type": ["integer", "null"]},
            "t": {"type": "string", "format": "date-time"},
            "d": {"type": "string", "format": "date"},
            "u": {"type": "string", "format": "uuid"},
            "b": {"type": "boolean"},
            "j": {},
            "l": {"type": "array", "items": {"type": ["number", "null"]}},
            "m": {"type": "object", "additionalProperties": {"type": "string"}},
            "st": {
                "type": ["object", "null"],
                "properties": {"x": {"type": "integer"}, "y": {"type": ["string", "null"]}},
            },
            "ls": {
                "type": "array",
                "items": {"type": "object", "properties": {"k": {"type": "boolean"}}},
            },
        },
        "required": ["req"],
    }
)
_UTC = dt.UTC


def _edge_rows() -> list[dict[str, Any]]:
    texts = ['a"b\\c', "\x00\x01\x1f\x7f", "\b\f\n\r\t", "\u2028\u2029", "é😀𝄞", "", "/<>&"]
    rows: list[dict[str, Any]] = []
    for i, text in enumerate(texts):
        rows.append({"s": text, "req": i, "m": [(text, text)], "j": json.dumps(text)})
    rows += [
        {"req": 1, "n": n, "l": [n, None, n]}
        for n in [1e-05, 1e16, 1e22, -0.0, 0.1, 2.5e-7, math.nan, math.inf, -math.inf, 5e-324]
    ]
    rows += [
        {"req": -(2**63), "o": 2**63 - 1},
        {"req": 0, "t": dt.datetime(1, 1, 1, tzinfo=_UTC), "d": dt.date(1, 1, 1)},
        {"req": 0, "t": dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=_UTC)},
        {"req": 0, "t": dt.datetime(1969, 12, 31, 23, 59, 59, 1, tzinfo=_UTC)},
        {"req": 0, "t": dt.datetime(2000, 2, 29, 12, 0, 0, 500000, tzinfo=_UTC)},
        {"req": 0, "d": dt.date(9999, 12, 31), "u": uuid.UUID(int=2**128 - 1).bytes},
        {"req": 0, "d": dt.date(1600, 2, 29), "u": uuid.UUID(int=0x0123456789ABCDEF).bytes},
        {"req": 0, "b": True, "st": {"x": None, "y": None}, "ls": [{"k": None}, {}]},
        {"req": 0, "b": False, "st": None, "ls": [], "l": [], "m": []},
        {"req": 0, "st": {"x": 5, "y": "z"}, "l": [None], "m": [("", "v"), ("k", "")]},
        {"req": 0, "j": "null"},
        {"req": 0, "j": '{"a":[1,2.5,"é"]}'},
    ]
    return rows


def test_edge_cases() -> None:
    compiled = _compiled(_EDGE)
    values = pa.array(_edge_rows(), compiled.storage).view(compiled.arrow)
    payloads = _same(compiled, values)
    assert payloads[0] == (
        b'{"s":"a\\"b\\\\c","n":null,"req":0,"o":null,"j":"a\\"b\\\\c",'
        b'"m":{"a\\"b\\\\c":"a\\"b\\\\c"},"st":null}'
    )
    assert payloads[1].startswith(b'{"s":"\\u0000\\u0001\\u001f\x7f"')
    assert payloads[2].startswith(b'{"s":"\\b\\f\\n\\r\\t"')
    assert payloads[3].startswith('{"s":"\u2028\u2029"'.encode())
    assert payloads[4].startswith('{"s":"é😀𝄞"'.encode())
    assert [p.split(b",")[0] for p in payloads[7:17]] == [
        b'{"n":' + n for n in
        [b"1e-05", b"1e+16", b"1e+22", b"-0.0", b"0.1", b"2.5e-07", b"NaN", b"Infinity",
         b"-Infinity", b"5e-324"]
    ]  # fmt: skip
    assert b'"l":[5e-324,null,5e-324]' in payloads[16]
    assert b'"req":-9223372036854775808,"o":9223372036854775807' in payloads[17]
    assert b'"t":"0001-01-01T00:00:00Z","d":"0001-01-01"' in payloads[18]
    assert b'"t":"9999-12-31T23:59:59.999999Z"' in payloads[19]
    assert b'"t":"1969-12-31T23:59:59.000001Z"' in payloads[20]
    assert b'"t":"2000-02-29T12:00:00.500000Z"' in payloads[21]
    assert b'"u":"ffffffff-ffff-ffff-ffff-ffffffffffff"' in payloads[22]
    assert b'"d":"1600-02-29","u":"00000000-0000-0000-0123-456789abcdef"' in payloads[23]
    assert payloads[24].endswith(b'"b":true,"st":{"y":null},"ls":[{},{}]}')
    assert payloads[25].endswith(b'"b":false,"l":[],"m":{},"st":null,"ls":[]}')
    assert payloads[26].endswith(b'"l":[null],"m":{"":"v","k":""},"st":{"x":5,"y":"z"}}')
    assert payloads[27].endswith(b'"j":null,"st":null}')
    assert payloads[28].endswith('"j":{"a":[1,2.5,"é"]},"st":null}'.encode())
    # Read back, they encode to the same bytes (but for JSON text that was not canonical).
    decoded = CODEC.decode(_EDGE, pa.array(payloads, pa.large_binary()))
    again = _same(compiled, decoded.values)
    assert [i for i, p in enumerate(payloads) if p != again[i]] == [1, 3, 4]
    assert decoded.keep_bytes.tolist() == [i in (1, 3, 4) for i in range(len(payloads))]


def test_rows_the_kernel_hands_back() -> None:
    compiled = _compiled(_EDGE)
    rows = [{"req": i, "n": 5e-324 if i % 3 == 0 else 1.5, "s": "é" * i} for i in range(10)]
    values = pa.array(rows, compiled.storage).view(compiled.arrow)
    _same(compiled, values)
    _same(compiled, values.slice(3, 1))
    _same(compiled, values.slice(0, 0))
    bad_text = pa.Array.from_buffers(
        pa.large_string(),
        1,
        [None, pa.py_buffer(np.array([0, 1], np.int64)), pa.py_buffer(b"\xff")],
    )
    for column in ("s", "j"):
        struct = pa.StructArray.from_arrays([bad_text, pa.array([1])], names=[column, "req"])
        full = pa.array([{"req": 1}], compiled.storage)
        children = [struct.field(column) if f.name == column else full.field(f.name)
                    for f in compiled.storage]  # fmt: skip
        values = pa.StructArray.from_arrays(children, fields=list(compiled.storage))
        with pytest.raises(UnicodeDecodeError):
            compiled.encode_python(values.view(compiled.arrow))
        with pytest.raises(UnicodeDecodeError):
            compiled.encode(values.view(compiled.arrow))
    late = pa.array([{"req": 1, "t": dt.datetime(2024, 1, 1, tzinfo=_UTC)}], compiled.storage)
    far = pa.array([2**62], pa.timestamp("us", tz="UTC"))
    children = [far if f.name == "t" else late.field(f.name) for f in compiled.storage]
    values = pa.StructArray.from_arrays(children, fields=list(compiled.storage))
    with pytest.raises(OverflowError):
        compiled.encode(values.view(compiled.arrow))


def test_null_rows_other_types_and_chunks() -> None:
    compiled = _compiled(_EDGE)
    with pytest.raises(ValueError, match="null row"):
        compiled.encode(pa.array([{"req": 1}, None], compiled.storage).view(compiled.arrow))
    values = pa.array([{"req": 1, "s": "x"}, {"req": 2}], compiled.storage)
    # The storage type (uuid as 16 bytes) and other types go through the Python writer.
    assert compiled.encode(values).to_pylist() == _same(compiled, values.view(compiled.arrow))
    small = pa.array([{"s": "x", "req": 1}], pa.struct([("s", pa.string()), ("req", pa.int64())]))
    assert compiled.encode(small).to_pylist() == compiled.encode_python(small).to_pylist()
    chunked = pa.chunked_array([values.view(compiled.arrow)] * 3)
    assert compiled.encode(chunked).to_pylist() == compiled.encode_python(chunked).to_pylist()


def test_roots_that_are_not_objects() -> None:
    for schema, rows in [
        ({"type": "array", "items": {"type": ["string", "null"]}}, [["a", None], []]),
        ({"type": "number"}, [1.5, 1e300]),
        ({"description": "anything"}, ["[1,2]", "null"]),
        ({"type": "object", "additionalProperties": {"type": "integer"}}, [[("a", 1)], []]),
    ]:
        compiled = _compiled(_registered(schema))
        _same(compiled, pa.array(rows, compiled.storage).view(compiled.arrow))


# --- generated schemas and values ---


@st.composite
def _cases(draw: st.DrawFn) -> tuple[RegisteredSchema, Any, list[Any]]:
    schema = _registered(draw(object_schemas()))
    node = parse_json_schema(schema)
    values = draw(st.lists(values_of(node), min_size=1, max_size=6))
    return schema, node, values


@SETTINGS
@given(_cases())
def test_canonical_payloads_decode_and_encode_back(
    case: tuple[RegisteredSchema, Any, list[Any]],
) -> None:
    schema, _, values = case
    payloads = [canonical_bytes(v) for v in values]
    decoded = CODEC.decode(schema, pa.array(payloads, pa.large_binary()))
    assert decoded.errors == [None] * len(values) and not decoded.keep_bytes.any()
    assert _same(_compiled(schema), decoded.values) == payloads


@SETTINGS
@given(_cases(), st.data())
def test_liberal_payloads_encode_alike(
    case: tuple[RegisteredSchema, Any, list[Any]], data: st.DataObject
) -> None:
    schema, node, _ = case
    values = data.draw(st.lists(values_of(node, canonical=False), min_size=1, max_size=6))
    writer = LiberalWriter(data.draw)
    payloads = [writer.write(node, value).encode() for value in values]
    decoded = CODEC.decode(schema, pa.array(payloads, pa.large_binary()))
    good = [i for i, error in enumerate(decoded.errors) if error is None]
    compiled = _compiled(schema)
    _same(compiled, decoded.values.take(pa.array(good, pa.int64())))


@SETTINGS
@given(_cases())
def test_values_built_in_arrow_encode_alike(
    case: tuple[RegisteredSchema, Any, list[Any]],
) -> None:
    schema, node, values = case
    compiled = _compiled(schema)
    rows = [expected(node, v) for v in values]
    for row in rows:  # uuids as the storage type holds them
        _uuid_bytes(row)
    array = pa.array(rows, compiled.storage)
    _same(compiled, array if compiled.storage == compiled.arrow else array.view(compiled.arrow))


def _uuid_bytes(value: Any) -> Any:
    """``value`` with every uuid.UUID replaced by its bytes, in place where it can."""
    if isinstance(value, uuid.UUID):
        return value.bytes
    if isinstance(value, dict):
        for key, item in value.items():
            value[key] = _uuid_bytes(item)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            value[index] = _uuid_bytes(item)
    elif isinstance(value, tuple):
        return tuple(_uuid_bytes(item) for item in value)
    return value


def test_strings_with_a_special_byte_anywhere() -> None:
    compiled = _compiled(_registered({"type": "array", "items": {"type": "string"}}))
    texts = ["x" * n for n in range(40)]
    for special in ['"', "\\", "\n", "\x1f", "\x00", "é", "\u2028", "😀", "\x7f", " ", "~", "!"]:
        texts += [
            "a" * position + special + "b" * (n - position)
            for n in range(0, 34, 3)
            for position in range(n + 1)
        ]
    rows = [texts[i : i + 7] for i in range(0, len(texts), 7)]
    payloads = _same(compiled, pa.array(rows, compiled.storage))
    assert payloads == [
        json.dumps(r, separators=(",", ":"), ensure_ascii=False).encode() for r in rows
    ]


def test_large_string_columns_sized_exactly() -> None:
    compiled = _compiled(_registered({"type": "array", "items": {"type": "string"}}))
    texts = ["\x01" * 3000, '"' * 3000, "é" * 1500, "x" * 3000]
    rows = [texts] * 500  # 6 MB of string bytes: the exact count of escapes sizes the output
    assert (
        _same(compiled, pa.array(rows, compiled.storage))[0]
        == json.dumps(texts, separators=(",", ":"), ensure_ascii=False).encode()
    )
