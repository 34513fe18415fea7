"""The Protobuf codec's compiled kernel against its upb path: for any payload, canonical or not,
``ProtobufCodec._decode`` (kernel, upb for the rows it cannot prove canonical) gives exactly
what ``ProtobufCodec._decode_upb`` gives: values, ``keep_bytes`` and errors.

Messages come from ``protobuf_gen`` (and a proto2 schema without a group, which the kernel
handles; the generator's proto2 schema has one, so it is decoded by upb only), serialized
deterministically, then mutated the ways a non-canonical writer differs: fields reordered or
duplicated, unknown fields, explicit defaults, unpacked repeated fields, non-minimal varints,
long-form index lists, truncation, corrupt bytes, wrong wire types.

``PROTOBUF_EXAMPLES`` sets the number of hypothesis examples (60 by default)."""

from __future__ import annotations

import math
from typing import Any

import pyarrow as pa
import pytest
from google.protobuf.message import Message
from hypothesis import given
from hypothesis import strategies as st

from bergstream.core.api import DecodedValues
from tests.kits.protobuf_gen import messages
from tests.value_codecs.protobuf_kit import SETTINGS, SchemaSet, proto2_plain

SMALL = """
syntax = "proto3";
package fast.small;
import "google/protobuf/timestamp.proto";
message R {
  int32 i = 1; string s = 2; repeated int32 nums = 3; map<string, int32> m = 4; Sub sub = 5;
  optional int32 oi = 6; E e = 7; double d = 8; google.protobuf.Timestamp ts = 9; float f = 10;
  uint64 big = 300;
  enum E { ZERO = 0; ONE = 1; }
  message Sub { int32 x = 1; }
}
"""

KIT = SchemaSet(proto2_plain("fast.v2"), "small", SMALL)
CODEC = KIT.codec
SCHEMAS = KIT.schemas
_compiled = KIT.compiled


def _plain(value: Any) -> Any:
    """``value`` (from ``to_pylist``) with NaNs made comparable."""
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _same(name: str, payloads: list[bytes], skip: int = 0) -> DecodedValues:
    compiled = _compiled(name)
    array = pa.array(payloads, pa.large_binary())
    old = CODEC._decode_upb(compiled, array, skip)
    new = CODEC._decode(compiled, array, skip)
    assert new.values.type == old.values.type
    assert _plain(new.values.to_pylist()) == _plain(old.values.to_pylist())
    assert new.values.null_count == old.values.null_count
    assert list(new.keep_bytes) == list(old.keep_bytes)
    assert new.errors == old.errors
    new.values.validate(full=True)
    return new


# ---------------------------------------------------------------- wire-level mutations


def _varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def _records(body: bytes) -> list[tuple[int, bytes]]:
    """The top-level (tag, whole record bytes) of a valid message body."""
    out = []
    pos = 0
    while pos < len(body):
        start = pos
        tag, pos = _read_varint(body, pos)
        wire = tag & 7
        if wire == 0:
            _, pos = _read_varint(body, pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire in (3, 4):  # a group's start or end: the tag alone
            pass
        else:
            length, pos = _read_varint(body, pos)
            pos += length
        out.append((tag, body[start:pos]))
    return out


@st.composite
def _mutated(draw: st.DrawFn, body: bytes) -> bytes:
    """``body`` changed the way a non-canonical (or broken) writer would."""
    records = _records(body)
    kind = draw(st.sampled_from(
        ["swap", "duplicate", "unknown", "default", "nonminimal", "unpack", "truncate",
         "flip", "wiretype", "insert", "drop"]
    ))  # fmt: skip
    if kind == "swap" and len(records) >= 2:
        i = draw(st.integers(0, len(records) - 2))
        records[i], records[i + 1] = records[i + 1], records[i]
    elif kind == "duplicate" and records:
        i = draw(st.integers(0, len(records) - 1))
        records.insert(i + 1, records[i])
    elif kind == "unknown":
        number = draw(st.sampled_from([99, 1000, 536870911]))
        record = _varint(number << 3) + _varint(draw(st.integers(0, 2**64 - 1)))
        records.insert(draw(st.integers(0, len(records))), (number << 3, record))
    elif kind == "default":
        number = draw(st.integers(1, 60))
        wire = draw(st.sampled_from([0, 1, 2, 5]))
        value = {0: b"\x00", 1: b"\x00" * 8, 2: b"\x00", 5: b"\x00" * 4}[wire]
        tag = (number << 3) | wire
        records.append((tag, _varint(tag) + value))
        records.sort(key=lambda r: r[0] >> 3)
    elif kind == "nonminimal" and records:
        i = draw(st.integers(0, len(records) - 1))
        tag, record = records[i]
        _, after = _read_varint(record, 0)
        records[i] = (tag, _varint(tag)[:-1] + bytes([_varint(tag)[-1] | 0x80, 0]) + record[after:])
    elif kind == "unpack" and records:
        out = []
        for tag, record in records:
            _, pos = _read_varint(record, 0)
            if tag & 7 == 2:
                length, pos = _read_varint(record, pos)
                items = record[pos : pos + length]
                try:
                    values = []
                    p = 0
                    while p < len(items):
                        v, p = _read_varint(items, p)
                        values.append(v)
                except IndexError:
                    values = []
                if values and draw(st.booleans()):
                    unpacked = (tag & ~7) | 0
                    for v in values:
                        out.append((unpacked, _varint(unpacked) + _varint(v)))
                    continue
            out.append((tag, record))
        records = out
    elif kind == "wiretype" and records:
        i = draw(st.integers(0, len(records) - 1))
        tag, record = records[i]
        _, after = _read_varint(record, 0)
        new_tag = (tag & ~7) | draw(st.sampled_from([0, 1, 2, 5]))
        records[i] = (new_tag, _varint(new_tag) + record[after:])
    elif kind == "drop" and records:
        records.pop(draw(st.integers(0, len(records) - 1)))
    out = b"".join(record for _, record in records)
    if kind == "truncate" and out:
        out = out[: draw(st.integers(0, len(out) - 1))]
    elif kind == "flip" and out:
        i = draw(st.integers(0, len(out) - 1))
        out = out[:i] + bytes([out[i] ^ draw(st.integers(1, 255))]) + out[i + 1 :]
    elif kind == "insert":
        i = draw(st.integers(0, len(out)))
        out = out[:i] + draw(st.binary(min_size=1, max_size=3)) + out[i:]
    return out


def _prefix(draw: st.DrawFn) -> bytes:
    return draw(st.sampled_from([b"\x00"] * 6 + [b"\x02\x00", b"\x02\x02", b"", b"\x04"]))


@st.composite
def _batch(draw: st.DrawFn, name: str) -> list[bytes]:
    message_class: type[Message] = _compiled(name).message
    out = []
    for _ in range(draw(st.integers(1, 6))):
        body = draw(messages(message_class)).SerializeToString(deterministic=True)
        if draw(st.integers(0, 2)) == 0:
            body = draw(_mutated(body))
        out.append(_prefix(draw) + body if draw(st.integers(0, 5)) == 0 else b"\x00" + body)
    return out


@pytest.mark.parametrize("name", ["v3", "v2", "v2plain", "small"])
def test_fast_path_matches_upb(name: str) -> None:
    """Generated and mutated batches decode the same on both paths."""

    @SETTINGS
    @given(_batch(name))
    def check(payloads: list[bytes]) -> None:
        _same(name, payloads)

    check()


def test_canonical_rows_take_the_kernel() -> None:
    """Deterministic serializations of messages using every kind of field are decoded by the
    kernel alone (so the comparisons here exercise it)."""
    compiled = _compiled("v3")
    bodies = []
    for i in range(20):
        m = compiled.message()
        m.i32, m.si32, m.sf32, m.i64, m.u64, m.f64 = -i - 1, -i, i + 1, 2**40 + i, 2**64 - 1, i + 1
        m.fl, m.db, m.bo, m.st, m.by, m.color = 1.5, -0.0, True, "é" * i + "x", b"\xff", -3
        m.opt_i, m.opt_s, m.opt_c = 0, "", 0
        m.c_inner.name = "n"
        m.inner.tags.extend([1, 2, -3])
        m.inner.deeper.d.seconds = -5
        m.r_i32.extend([0, -1, i])
        m.r_st.extend(["", "a"])
        m.r_inner.add().deeper.n = 3
        m.m_si["k" * i] = i
        m.m_li[-i].name = "v"
        m.m_ts["t"].seconds = 10
        m.ts.seconds, m.ts.nanos = 1_763_000_000 + i, 123_000
        m.du.seconds, m.du.nanos = -1, -5000
        m.r_ts.add()
        m.w_db.value = 0.0
        m.w_st.value = "w"
        m.w_u64.value = 7
        m.empty.SetInParent()
        m.r_empty.add()
        m.r_w.add().value = 4
        bodies.append(b"\x00" + m.SerializeToString(deterministic=True))
    bodies.append(b"\x00")
    assert compiled.fast is not None
    _, slow = compiled.fast.decode_fast(pa.array(bodies, pa.large_binary()), 0)
    assert not slow.any()
    decoded = _same("v3", bodies)
    assert not decoded.keep_bytes.any()


def test_group_schema_uses_upb_only() -> None:
    """A schema with a group has no kernel program."""
    assert _compiled("v2").fast is None
    assert _compiled("v2plain").fast is not None


HAND_MADE = [
    b"\x00",  # empty message
    b"\x00\x08\x01\x12\x01x\x1a\x02\x01\x02",  # canonical
    b"\x00\x12\x01x\x08\x01",  # out of number order
    b"\x00\x18\x01\x18\x02",  # unpacked repeated (proto3)
    b"\x00\x1a\x01\x01\x1a\x01\x02",  # packed split in two chunks
    b"\x00\x1a\x00",  # empty packed chunk
    b"\x00\x08\x00",  # explicit default (implicit presence)
    b"\x00\x12\x00",  # explicit empty string
    b"\x00\x41" + b"\x00" * 8,  # explicit 0.0 double
    b"\x00\x41" + b"\x00" * 7 + b"\x80",  # -0.0 double: canonical
    b"\x00\x30\x00",  # optional = 0: canonical
    b"\x00\x08\x01\x08\x02",  # duplicate singular scalar
    b"\x00\x2a\x02\x08\x01\x2a\x02\x08\x02",  # duplicate sub-message
    b"\x00\x2a\x00",  # empty sub-message: canonical
    b"\x00\x08\x81\x00",  # non-minimal varint
    b"\x00\x88\x00\x01",  # non-minimal tag
    b"\x00\x08\xff\xff\xff\xff\x0f",  # int32 -1 in 5 bytes
    b"\x00\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # int32 -1: canonical
    b"\x00\x08\x80\x80\x80\x80\x10",  # int32 out of range
    b"\x00\x38\x05",  # unknown open enum value
    b"\x00\x08\x01\xc8\x01\x07",  # unknown field at the end
    b"\x00\x22\x05\x0a\x01b\x10\x01\x22\x05\x0a\x01a\x10\x02",  # map b, a
    b"\x00\x22\x05\x0a\x01a\x10\x02\x22\x05\x0a\x01b\x10\x01",  # map a, b
    b"\x00\x22\x05\x10\x01\x0a\x01b",  # map entry value before key
    b"\x00\x22\x03\x0a\x01b",  # map entry value omitted
    b"\x00\x22\x04\x0a\x00\x10\x00",  # map entry of defaults: canonical
    b"\x00\x22\x05\x0a\x01b\x10\x01\x22\x05\x0a\x01b\x10\x02",  # duplicate map key
    b"\x02\x00\x08\x01",  # long-form index [0]
    b"\x02\x02\x08\x01",  # index [1]
    b"\x04\x02",  # truncated index list
    b"",  # no index list
    b"\x00\x08",  # truncated varint
    b"\x00\x12\x05ab",  # truncated string
    b"\x00\x12\x02\xc3\x28",  # invalid UTF-8
    b"\x00\x0a\x01\x01",  # wrong wire type for field 1
    b"\x00\x4a\x02\x08\x01",  # timestamp 1 s
    b"\x00\x4a\x04\x08\x01\x10\x01",  # timestamp with 1 ns
    b"\x00\x4a\x07\x10\xe8\x07\x08\x01\x00\x00",  # timestamp fields reordered + junk
    b"\x00\x4a\x0b\x08\xff\xff\xff\xff\xff\xff\xff\xff\x7f",  # timestamp beyond range
    b"\x00\x55\x00\x00\xc0\x7f",  # float NaN
    b"\x00\x55\x00\x00\x80\x3f",  # float 1.0
    b"\x00\xe0\x12\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # uint64 max
    b"\x00\x1a\x03\x01\x80\x01",  # packed with a multi-byte element
    b"\x00\x1a\x02\x01\x80",  # packed with a truncated element
    b"\x00\x0c\x08\x01",  # a group start tag
]


def test_hand_made_encodings() -> None:
    """Non-canonical and broken encodings of a small schema, one by one and in one batch."""
    for payload in HAND_MADE:
        _same("small", [payload])
    decoded = _same("small", HAND_MADE * 3)
    assert not decoded.keep_bytes[1]


def test_framed_and_sliced() -> None:
    """A header skipped in place, chunked and sliced input."""
    framed = [b"\x00\x00\x00\x00\x07" + p for p in HAND_MADE]
    _same("small", framed, skip=5)
    compiled = _compiled("small")
    array = pa.array(HAND_MADE * 2, pa.large_binary()).slice(3, 40)
    chunked = pa.chunked_array([array.slice(0, 10), array.slice(10)])
    new = CODEC._decode(compiled, chunked, 0)
    old = CODEC._decode_upb(compiled, array, 0)
    assert _plain(new.values.to_pylist()) == _plain(old.values.to_pylist())
    assert list(new.keep_bytes) == list(old.keep_bytes)
    assert new.errors == old.errors


def test_large_batch_grows_arenas() -> None:
    """A batch larger than the first guess of the arenas (long strings and lists)."""
    compiled = _compiled("small")
    message = compiled.message()
    message.s = "x" * 5000
    message.nums.extend(range(1, 3000))
    message.m["k"] = 3
    payloads = [b"\x00" + message.SerializeToString(deterministic=True)] * 40
    decoded = _same("small", payloads + HAND_MADE)
    assert not decoded.keep_bytes[:40].any()


def _entry(number: int, key: bytes, value: bytes) -> bytes:
    """A map entry record of field ``number`` (key and value records given whole)."""
    body = key + value
    return _varint(number << 3 | 2) + _varint(len(body)) + body


BAD_UTF8 = b"\x0a\x02\xff\xfe"  # field 1 (a map entry's key), two bytes that are not UTF-8


@pytest.mark.parametrize(
    ("record", "cause"),
    [
        (_entry(14, BAD_UTF8, b"\x10\x01"), "map key of field by_name is not UTF-8"),
        (
            _entry(14, b"\x0a\x01a", b"\x10\x01") + _entry(14, BAD_UTF8, b""),
            "map key of field by_name is not UTF-8",
        ),
        (b"\x12\x02\xff\xfe", "string field s is not UTF-8"),
        (b"\x7a\x04\x12\x02\xff\xfe", "string field sub.names is not UTF-8"),
        (b"\x82\x01\x04\x12\x02\xff\xfe", "string field subs.names is not UTF-8"),
    ],
)
def test_proto2_text_not_utf8_fails_only_its_row(record: bytes, cause: str) -> None:
    """upb checks no UTF-8 in proto2: a string, repeated string or map key that is not UTF-8
    fails its row (null, bytes kept, a cause) on both paths, and the other rows decode."""
    good = b"\x00\x18\x01" + _entry(14, b"\x0a\x01k", b"\x10\x01")
    payloads = [good, b"\x00\x18\x02" + record, good]
    decoded = _same("v2plain", payloads)
    assert decoded.errors == [None, cause, None]
    assert decoded.keep_bytes.tolist() == [False, True, False]
    values = decoded.values.to_pylist()
    assert values[1] is None
    assert values[0] == values[2]
    assert values[0]["by_name"] == [("k", "HIGH")]
