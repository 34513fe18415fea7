"""The json-schema codec's compiled reader of canonical rows (:mod:`.json_kernel`): for any
batch, :meth:`decode` gives exactly what the Python reference (``decode_python``) gives (values,
``keep_bytes``, errors), by hypothesis over generated schemas with canonical, liberal and
corrupted payloads mixed in one batch, and by hand-made cases; and the double reader accepts
only ``repr`` texts.

``JSON_EXAMPLES`` sets the number of examples of each property test (80 by default)."""

from __future__ import annotations

import json
import os
import struct
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from bergstream.core.api import RegisteredSchema
from bergstream.plugins.value_codecs.json_schema.codec import JsonSchemaCodec
from bergstream.plugins.value_codecs.json_schema.number_reading import read_double, read_long
from bergstream.plugins.value_codecs.json_schema.types import parse_json_schema
from tests.kits.json_gen import (
    LiberalWriter,
    canonical_bytes,
    object_schemas,
    values_of,
)

CODEC = JsonSchemaCodec()
SETTINGS = settings(
    max_examples=int(os.environ.get("JSON_EXAMPLES", "80")),
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
)
_HEADER = b"\x00\x00\x00\x00\x07"


def _registered(schema: Any) -> RegisteredSchema:
    return RegisteredSchema(1, "JSON", json.dumps(schema))


def _compiled(schema: RegisteredSchema) -> Any:
    return CODEC._schemas.get(schema, None)


def _same(schema: RegisteredSchema, payloads: list[bytes]) -> np.ndarray:
    """Check that the compiled and the Python decode agree on ``payloads`` (also framed);
    the rows the kernel read itself."""
    compiled = _compiled(schema)
    for skip in (0, len(_HEADER)):
        array = pa.array([_HEADER[:skip] + p for p in payloads], pa.large_binary())
        new = compiled.decode(array, skip)
        old = compiled.decode_python(array, skip)
        new.values.validate(full=True)
        assert new.values.type == old.values.type
        assert new.values.equals(old.values)
        assert repr(new.values.to_pylist()) == repr(old.values.to_pylist())  # -0.0 too
        assert new.keep_bytes.tolist() == old.keep_bytes.tolist()
        assert new.errors == old.errors
    if compiled.fast is None:
        return np.zeros(len(payloads), dtype=bool)
    _, fallback = compiled.fast.decode(pa.array(payloads, pa.large_binary()))
    return ~fallback


@st.composite
def _batches(draw: st.DrawFn) -> tuple[RegisteredSchema, list[bytes]]:
    """A schema the kernel reads and a batch of canonical, liberal and corrupted payloads."""
    schema = _registered(draw(object_schemas()))
    assume(_compiled(schema).fast is not None)
    node = parse_json_schema(schema)
    writer = LiberalWriter(draw)
    payloads = []
    for _ in range(draw(st.integers(1, 6))):
        how = draw(st.sampled_from(["canonical", "canonical", "liberal", "corrupt"]))
        if how == "liberal":
            payloads.append(writer.write(node, draw(values_of(node, False))).encode())
            continue
        payload = bytearray(canonical_bytes(draw(values_of(node))))
        if how == "corrupt":
            for _ in range(draw(st.integers(1, 3))):
                position = draw(st.integers(0, len(payload)))
                byte = draw(st.sampled_from(b' "\\,:{}[]0123456789.eE+-nulltrfa\xc3\xa9\xff\x00'))
                action = draw(st.sampled_from(["insert", "delete", "replace"]))
                if action == "insert":
                    payload.insert(position, byte)
                elif position < len(payload):
                    if action == "delete":
                        del payload[position]
                    else:
                        payload[position] = byte
        payloads.append(bytes(payload))
    return schema, payloads


@SETTINGS
@given(_batches())
def test_compiled_decode_is_the_python_decode(case: tuple[RegisteredSchema, list[bytes]]) -> None:
    schema, payloads = case
    _same(schema, payloads)


@SETTINGS
@given(st.data())
def test_schemas_with_json_text_take_the_python_path(data: st.DataObject) -> None:
    schema = _registered(data.draw(object_schemas()))
    node = parse_json_schema(schema)
    values = data.draw(st.lists(values_of(node), min_size=1, max_size=3))
    _same(schema, [canonical_bytes(v) for v in values])


_WIDE = _registered(
    {
        "type": "object",
        "properties": {
            "n": {"type": "integer"},
            "x": {"type": "number"},
            "s": {"type": "string"},
            "b": {"type": ["boolean", "null"]},
            "t": {"type": "string", "format": "date-time"},
            "d": {"type": "string", "format": "date"},
            "u": {"type": "string", "format": "uuid"},
            "l": {"type": "array", "items": {"type": ["number", "null"]}},
            "m": {"type": "object", "additionalProperties": {"type": "string"}},
            "o": {
                "type": ["object", "null"],
                "properties": {
                    "deep": {
                        "type": "array",
                        "items": {"type": "array", "items": {"type": "integer"}},
                    },
                    "k": {"type": "string"},
                },
            },
        },
        "required": ["n"],
    }
)

_BASE = {
    "n": 1, "x": 0.5, "s": "a", "b": True, "t": "2024-02-29T23:59:59Z", "d": "2024-02-29",
    "u": "0b8e4a4c-5e3c-4c1e-9d4b-2f0e4a6b7c8d", "l": [1.5, None], "m": {"k": "v"},
    "o": {"deep": [[1, 2], []], "k": "z"},
}  # fmt: skip


def _with(**changes: Any) -> bytes:
    return canonical_bytes({**_BASE, **changes})


def _text(**changes: str) -> bytes:
    """The canonical payload of ``_BASE`` with some values' texts replaced."""
    parts = []
    for name, value in _BASE.items():
        text = changes.get(name, json.dumps(value, separators=(",", ":"), ensure_ascii=False))
        parts.append(json.dumps(name) + ":" + text)
    return ("{" + ",".join(parts) + "}").encode()


_READ = [
    _with(),
    _with(s='q"\\\n\r\t\b\f\x00\x1f\x7f é \u2028 😀/'),
    _with(s=""),
    _with(b=None, o=None, l=[], m={}),
    _with(n=-(2**63), x=-0.0),
    _with(n=2**63 - 1, x=1e-05),
    _with(x=1e16),
    _with(x=0.1),
    _with(x=1.7976931348623157e308 / 1e290),
    _with(t="0001-01-01T00:00:00.000001Z", d="0001-01-01"),
    _with(t="9999-12-31T23:59:59.999999Z", d="9999-12-31"),
    _with(o={"deep": [], "k": "é"}),
    _with(m={"": "", "é": "x", "a\\b": "\n"}),
    canonical_bytes({k: v for k, v in _BASE.items() if k not in ("x", "s", "t", "d", "u")}),
]

_SLOW = [
    _with(x=5e-324),
    _with(x=1e300),
    _with(n=2**63),
    _with(n=-(2**63) - 1),
    _with(x=1),
    _text(n="1.0"),
    _text(n="-0"),
    _text(n="01"),
    _text(x="1E-05"),
    _text(x="0.10"),
    _text(x="0.1000000000000000055511151231257827"),
    _text(x="0.30000000000000004"),
    _text(s='"\\u00e9"'),
    _text(s='"\\/"'),
    _text(s='"\\u001F"'),
    _text(s='"\\u000a"'),
    _text(s='"\x01"'),
    _text(s='"X"').replace(b'"X"', b'"\xff"'),
    _text(s='"X"').replace(b'"X"', b'"\xed\xa0\x80"'),
    _text(t='"2024-02-29T23:59:59.000000Z"'),
    _text(t='"2024-02-29T23:59:59+01:00"'),
    _text(t='"2024-02-29t23:59:59Z"'),
    _text(t='"2023-02-29T23:59:59Z"'),
    _text(t='"2024-02-29T24:00:00Z"'),
    _text(t='"0000-01-01T00:00:00Z"'),
    _text(d='"2023-02-29"'),
    _text(u='"0B8E4A4C-5E3C-4C1E-9D4B-2F0E4A6B7C8D"'),
    _text(u='"0b8e4a4c5e3c4c1e9d4b2f0e4a6b7c8d"'),
    _text(m='{"k":"v","k":"w"}'),
    _text(b="1"),
    _text(l="[1.5,null,]"),
    _text(o='{"deep":[[1,2],[]],"k":"z","zz":1}'),
    _text(o='{"k":"z","deep":[[1,2],[]]}'),
    b"null",
    b"{}",
    b'{"n":1} ',
    b'{"n":1}x',
    b"",
    b"[",
    b'{"n":1,',
]


@pytest.mark.parametrize("payload", _READ)
def test_canonical_rows_are_read_by_the_kernel(payload: bytes) -> None:
    assert _same(_WIDE, [payload]).tolist() == [True]
    assert not _compiled(_WIDE).decode(pa.array([payload], pa.large_binary())).keep_bytes[0]


@pytest.mark.parametrize("payload", _SLOW)
def test_other_rows_decode_as_in_python(payload: bytes) -> None:
    _same(_WIDE, [payload])


def test_mixed_batch_and_absent_optional_fields() -> None:
    without_n = canonical_bytes({k: v for k, v in _BASE.items() if k != "n"})
    read = _same(_WIDE, [*_READ, *_SLOW, without_n, *_READ])
    assert read[: len(_READ)].all()
    assert read[-len(_READ) :].all()
    assert not read[len(_READ) + len(_SLOW)]


def test_big_batch_grows_the_arenas() -> None:
    payloads = [
        _with(n=i, s="x" * (i % 300), l=[i / 7] * (i % 40), m={str(j): "v" for j in range(i % 9)})
        for i in range(3000)
    ]
    assert _same(_WIDE, payloads).all()


# --- the number readers ---

_SCRATCH = np.zeros(64, dtype=np.uint8)
_CELL = np.zeros(1, dtype=np.float64)


def _read_double(text: str) -> tuple[bool, float]:
    data = np.frombuffer(text.encode(), dtype=np.uint8)
    return read_double(data, 0, len(data), _SCRATCH, _CELL, _CELL.view(np.int64))


def _same_bits(a: float, b: float) -> bool:
    return struct.pack("<d", a) == struct.pack("<d", b)


@settings(max_examples=3000, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_repr_of_a_float_reads_back_when_accepted(number: float) -> None:
    ok, value = _read_double(repr(number))
    if ok:
        assert _same_bits(value, number)


def test_usual_doubles_are_proven_canonical() -> None:
    """Exact ties are left to Python; ordinary values are not."""
    rng = np.random.default_rng(7)
    numbers = [i / (k + 1.5) for i in range(20_000) for k in range(5)]
    numbers += rng.uniform(-1e6, 1e6, 20_000).tolist() + rng.normal(0, 1e-3, 20_000).tolist()
    assert all(_read_double(repr(x))[0] for x in numbers)


@settings(max_examples=3000, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False), st.integers(1, 20), st.data())
def test_only_repr_texts_are_accepted(number: float, digits: int, data: st.DataObject) -> None:
    texts = [f"{number:.{digits}g}", f"{number:.{digits}e}", f"{number:.17g}", f"{number:.16g}"]
    text = repr(number)
    position = data.draw(st.integers(0, len(text) - 1))
    texts.append(text[:position] + data.draw(st.sampled_from("0123456789.e-+")) + text[position:])
    texts.append(text[:position] + text[position + 1 :])
    for candidate in texts:
        ok, value = _read_double(candidate)
        if ok:
            assert repr(value) == candidate


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("0.0", True), ("-0.0", True), ("1e-05", True), ("1e+16", True), ("0.1", True),
        ("0.0001", True), ("1234567890123456.0", True), ("1e+22", True), ("1e+23", True),
        ("0.30000000000000004", True), ("0.6666666666666666", True), ("5e-324", False),
        ("1", False), ("1.", False), (".5", False), ("00.1", False), ("1e5", False),
        ("1E+16", False), ("1.0e+16", False), ("0.00001", False), ("10000000000000000.0", False),
        ("-", False), ("", False), ("1.50", False),
    ],
)  # fmt: skip
def test_double_texts(text: str, ok: bool) -> None:
    accepted, value = _read_double(text)
    assert accepted == ok
    if ok:
        assert repr(value) == text


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", 0), ("-1", -1), ("9223372036854775807", 2**63 - 1),
        ("-9223372036854775808", -(2**63)), ("9223372036854775808", None),
        ("-9223372036854775809", None), ("12345678901234567890", None), ("-0", None),
        ("01", None), ("1.0", None), ("1e5", None), ("-", None), ("", None),
    ],
)  # fmt: skip
def test_long_texts(text: str, value: int | None) -> None:
    data = np.frombuffer(text.encode() + b"}", dtype=np.uint8)
    read, after = read_long(data, 0, len(data))
    assert (None if after < 0 else read) == value
    if value is not None:
        assert after == len(text)
