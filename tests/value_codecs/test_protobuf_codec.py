"""The Protobuf value codec: schemas in both registry forms (text and base64 descriptors, with
references), the Iceberg mapping, decoding generated messages against a row-by-row reference,
byte-exact re-encoding of every row that does not keep its bytes, non-canonical payloads that
must keep them or fail with a cause, and the codec as the pipeline uses it (pickling, threads,
chunked and sliced batches, framed values).

``PROTOBUF_EXAMPLES`` sets the number of hypothesis examples (60 by default)."""

from __future__ import annotations

import base64
import os
import pickle
import struct
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pytest
from google.protobuf import descriptor_pb2, timestamp_pb2
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DecimalType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestamptzType,
)

from bergstream.core.api import RegisteredSchema, SchemaNotExpressible, SchemaReference
from bergstream.plugins.value_codecs.protobuf.codec import ProtobufCodec, read_indexes
from tests.kits.protobuf_gen import PROTO2, PROTO3, expected, messages

SETTINGS = settings(
    max_examples=int(os.environ.get("PROTOBUF_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

CODEC = ProtobufCodec()
V3 = RegisteredSchema(1, "PROTOBUF", PROTO3)
V2 = RegisteredSchema(2, "PROTOBUF", PROTO2)

SMALL = RegisteredSchema(
    3,
    "PROTOBUF",
    """
syntax = "proto3";
package t;
import "google/protobuf/timestamp.proto";
message R {
  int32 i = 1; string s = 2; repeated int32 nums = 3; map<string, int32> m = 4; Sub sub = 5;
  optional int32 oi = 6; E e = 7; double d = 8; google.protobuf.Timestamp ts = 9; float f = 10;
  enum E { ZERO = 0; ONE = 1; }
  message Sub { int32 x = 1; }
}
message Other { int32 z = 1; message Deep { int32 y = 1; } }
""",
)


def _class(schema: RegisteredSchema) -> type[Message]:
    return CODEC._schemas.get(schema, None).message


def _binary(payloads: list[bytes]) -> pa.Array:
    return pa.array(payloads, pa.large_binary())


def _check_round_trip(schema: RegisteredSchema, payloads: list[bytes]) -> object:
    """Decode, validate, and re-encode every row that decoded without keeping its bytes: the
    invariant the codec promises."""
    decoded = CODEC.decode(schema, _binary(payloads))
    decoded.values.validate(full=True)
    assert decoded.values.type == CODEC.arrow_type(schema)
    assert len(decoded.values) == len(payloads) == len(decoded.keep_bytes)
    for row, error in enumerate(decoded.errors):
        if error is not None:
            assert decoded.keep_bytes[row]
            assert not decoded.values[row].is_valid
    exact = [row for row, keep in enumerate(decoded.keep_bytes) if not keep]
    if exact:
        taken = decoded.values.take(pa.array(exact))
        encoded = CODEC.encode(schema, taken).to_pylist()
        assert encoded == [payloads[row] for row in exact]
    return decoded


# ---------------------------------------------------------------- types


def test_iceberg_type_maps_every_kind() -> None:
    type_ = CODEC.iceberg_type(V3, lambda ref: pytest.fail("no references"))
    assert isinstance(type_, StructType)
    fields = {f.name: f for f in type_.fields}
    assert fields["i32"].field_type == IntegerType() and fields["i32"].required
    assert fields["u32"].field_type == LongType()
    assert fields["u64"].field_type == DecimalType(20, 0)
    assert fields["f64"].field_type == DecimalType(20, 0)
    assert fields["by"].field_type == BinaryType()
    assert fields["color"].field_type == StringType() and fields["color"].required
    assert not fields["opt_i"].required
    assert not fields["c_str"].required and not fields["c_inner"].required
    assert not fields["inner"].required and isinstance(fields["inner"].field_type, StructType)
    assert fields["ts"].field_type == TimestamptzType() and not fields["ts"].required
    assert fields["du"].field_type == LongType() and not fields["du"].required
    assert fields["w_u64"].field_type == DecimalType(20, 0) and not fields["w_u64"].required
    assert fields["w_bo"].field_type == BooleanType()
    assert fields["empty"].field_type == BooleanType()
    r_ts = fields["r_ts"].field_type
    assert isinstance(r_ts, ListType) and r_ts.element_required and fields["r_ts"].required
    m_li = fields["m_li"].field_type
    assert isinstance(m_li, MapType) and m_li.key_type == LongType() and m_li.value_required
    assert fields["m_uc"].field_type.key_type == DecimalType(20, 0)  # type: ignore[attr-defined]
    ids = _ids(type_)
    assert len(ids) == len(set(ids))
    assert ids[: len(type_.fields)] == list(range(1, len(type_.fields) + 1))  # pre-order


def _ids(type_: object) -> list[int]:
    out: list[int] = []
    if isinstance(type_, StructType):
        out += [f.field_id for f in type_.fields]
        for f in type_.fields:
            out += _ids(f.field_type)
    elif isinstance(type_, ListType):
        out += [type_.element_id, *_ids(type_.element_type)]
    elif isinstance(type_, MapType):
        out += [type_.key_id, type_.value_id, *_ids(type_.key_type), *_ids(type_.value_type)]
    return out


def test_proto2_presence_makes_fields_optional() -> None:
    type_ = CODEC.iceberg_type(V2, lambda ref: pytest.fail("no references"))
    fields = {f.name: f for f in type_.fields}  # type: ignore[attr-defined]
    assert not fields["a"].required and not fields["r"].required  # upb does not enforce required
    assert fields["unpacked"].required
    assert isinstance(fields["grp"].field_type, StructType)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('syntax = "proto3"; message Node { Node next = 1; }', "Node"),
        ('syntax = "proto3"; message A { B b = 1; } message B { repeated A a = 1; }', "A"),
        (
            'syntax = "proto3"; import "google/protobuf/struct.proto"; '
            "message J { google.protobuf.Struct s = 1; }",
            "google.protobuf.Struct",
        ),
    ],
)
def test_recursive_messages_are_refused(text: str, named: str) -> None:
    with pytest.raises(SchemaNotExpressible, match=f"recursive message {named}"):
        ProtobufCodec().iceberg_type(RegisteredSchema(9, "PROTOBUF", text), _no_refs)


def _no_refs(ref: SchemaReference) -> RegisteredSchema:
    raise AssertionError(f"unexpected reference {ref}")


def test_bad_text_names_protoc_error() -> None:
    bad = RegisteredSchema(7, "PROTOBUF", 'syntax = "proto3"; message X { strin a = 1; }')
    with pytest.raises(SchemaNotExpressible, match="strin"):
        ProtobufCodec().iceberg_type(bad, _no_refs)


def test_missing_import_is_refused() -> None:
    text = 'syntax = "proto3"; import "common.proto"; message X { c.C a = 1; }'
    with pytest.raises(SchemaNotExpressible):
        ProtobufCodec().iceberg_type(RegisteredSchema(5, "PROTOBUF", text), _no_refs)


def test_no_message_and_wrong_type_are_refused() -> None:
    with pytest.raises(SchemaNotExpressible, match="no message"):
        ProtobufCodec().iceberg_type(
            RegisteredSchema(5, "PROTOBUF", 'syntax = "proto3";'), _no_refs
        )
    with pytest.raises(SchemaNotExpressible, match="not Protobuf"):
        ProtobufCodec().iceberg_type(RegisteredSchema(5, "AVRO", '"int"'), _no_refs)


# ---------------------------------------------------------------- references, both forms

COMMON = 'syntax = "proto3"; package c; import "google/protobuf/timestamp.proto"; '
COMMON += "message C { string k = 1; google.protobuf.Timestamp at = 2; }"
ROOT = 'syntax = "proto3"; package r; import "common.proto"; '
ROOT += 'import "google/protobuf/timestamp.proto"; message Root { c.C c = 1; int32 n = 2; }'


def _as_base64(text: str, name: str, deps: dict[str, str] | None = None) -> str:
    """``text`` compiled as a base64 ``FileDescriptorProto``, as confluent-kafka registers."""
    codec = ProtobufCodec()
    refs = tuple(SchemaReference(dep, dep, 1) for dep in deps or {})
    texts = {dep: RegisteredSchema(0, "PROTOBUF", t) for dep, t in (deps or {}).items()}
    schema = RegisteredSchema(0, "PROTOBUF", text, refs)
    pool_file = codec._schemas.get(schema, lambda ref: texts[ref.name]).file
    fdp = descriptor_pb2.FileDescriptorProto()
    pool_file.CopyToProto(fdp)
    fdp.name = name
    return base64.b64encode(fdp.SerializeToString()).decode()


@pytest.mark.parametrize("root_form", ["text", "base64"])
@pytest.mark.parametrize("common_form", ["text", "base64"])
@pytest.mark.parametrize("wkt_reference", [False, True])
def test_references_in_either_form(root_form: str, common_form: str, wkt_reference: bool) -> None:
    common = COMMON if common_form == "text" else _as_base64(COMMON, "common.proto")
    root = (
        ROOT if root_form == "text" else _as_base64(ROOT, "events.proto", {"common.proto": COMMON})
    )
    refs = [SchemaReference("common.proto", "common.proto", 1)]
    if wkt_reference:  # skip.known.types False: the registry's copy is not fetched
        refs.insert(0, SchemaReference("google/protobuf/timestamp.proto", "ts", 1))
    schema = RegisteredSchema(2, "PROTOBUF", root, tuple(refs))
    fetched: list[str] = []

    def resolve(ref: SchemaReference) -> RegisteredSchema:
        fetched.append(ref.name)
        return RegisteredSchema(1, "PROTOBUF", common)

    codec = ProtobufCodec()
    type_ = codec.iceberg_type(schema, resolve)
    assert [f.name for f in type_.fields] == ["c", "n"]  # type: ignore[attr-defined]
    assert fetched == ["common.proto"]
    root_class = codec._schemas.get(schema, None).message
    message = root_class(n=3)
    message.c.k = "x"
    message.c.at.seconds = 5
    payload = b"\x00" + message.SerializeToString()
    decoded = codec.decode(schema, _binary([payload]))
    assert decoded.values.to_pylist()[0]["c"]["k"] == "x"
    assert not decoded.keep_bytes[0]
    # pickled without the resolver: the references travel with the codec
    clone = pickle.loads(pickle.dumps(codec))
    assert clone.encode(schema, decoded.values).to_pylist() == [payload]


def test_unresolvable_reference() -> None:
    schema = RegisteredSchema(2, "PROTOBUF", ROOT, (SchemaReference("common.proto", "s", 1),))
    with pytest.raises(SchemaNotExpressible, match="no resolver"):
        ProtobufCodec().decode(schema, _binary([b"\x00"]))


# ---------------------------------------------------------------- generated messages


@st.composite
def _batches(draw: st.DrawFn, schema: RegisteredSchema) -> list[Message]:
    return draw(st.lists(messages(_class(schema)), min_size=1, max_size=5))


@SETTINGS
@given(st.sampled_from([V3, V2]).flatmap(lambda s: st.tuples(st.just(s), _batches(s))))
def test_generated_messages_decode_and_encode_exactly(case: tuple) -> None:
    schema, batch = case
    payloads = [b"\x00" + m.SerializePartialToString(deterministic=True) for m in batch]
    decoded = _check_round_trip(schema, payloads)
    assert decoded.errors == [None] * len(payloads)  # type: ignore[attr-defined]
    assert not decoded.keep_bytes.any()  # type: ignore[attr-defined]
    assert decoded.values.to_pylist() == [expected(m) for m in batch]  # type: ignore[attr-defined]


@SETTINGS
@given(
    st.sampled_from([V3, V2]).flatmap(lambda s: st.tuples(st.just(s), _batches(s))),
    st.data(),
)
def test_mutated_payloads_keep_bytes_or_encode_exactly(case: tuple, data: st.DataObject) -> None:
    schema, batch = case
    payloads = []
    for message in batch:
        payload = bytearray(b"\x00" + message.SerializePartialToString(deterministic=True))
        for _ in range(data.draw(st.integers(1, 3))):
            action = data.draw(st.sampled_from(["flip", "insert", "delete", "append"]))
            at = data.draw(st.integers(0, len(payload)))
            if action == "flip" and at < len(payload):
                payload[at] ^= 1 << data.draw(st.integers(0, 7))
            elif action == "insert":
                payload[at:at] = data.draw(st.binary(min_size=1, max_size=3))
            elif action == "delete" and at < len(payload):
                del payload[at]
            else:
                payload += data.draw(st.binary(min_size=1, max_size=3))
        payloads.append(bytes(payload))
    _check_round_trip(schema, payloads)


# ---------------------------------------------------------------- hand-made variants


def _small(**fields: object) -> bytes:
    return _class(SMALL)(**fields).SerializeToString()


CANONICAL = b"\x00" + _small(i=1, s="x", nums=[1, 2])
NON_CANONICAL = {
    "field order swapped": b"\x00\x12\x01x\x08\x01",
    "unpacked repeated": b"\x00\x18\x01\x18\x02",
    "packed split in two": b"\x00\x1a\x01\x01\x1a\x01\x02",
    "empty packed chunk": b"\x00\x1a\x00",
    "explicit proto3 default": b"\x00\x08\x00",
    "explicit empty string": b"\x00\x12\x00",
    "duplicate scalar": b"\x00\x08\x01\x08\x02",
    "duplicate sub-message": b"\x00\x2a\x02\x08\x01\x2a\x02\x08\x02",
    "non-minimal varint": b"\x00\x08\x81\x00",
    "unknown field at end": b"\x00\x08\x01\x98\x06\x07",
    "unknown field first": b"\x00\x98\x06\x07\x08\x01",
    "map out of key order": b"\x00\x22\x05\x0a\x01b\x10\x01\x22\x05\x0a\x01a\x10\x02",
    "map value before key": b"\x00\x22\x05\x10\x01\x0a\x01b",
    "map value omitted": b"\x00\x22\x03\x0a\x01b",
    "duplicate map key": b"\x00\x22\x05\x0a\x01b\x10\x01\x22\x05\x0a\x01b\x10\x02",
    "02 00 index form": b"\x02\x00" + CANONICAL[1:],
    "sub-microsecond timestamp": b"\x00\x4a\x02\x10\x01",
    "nanos out of range": b"\x00\x4a\x06\x10\x80\x94\xeb\xdc\x03",
    "float NaN": b"\x00\x55" + struct.pack("<f", float("nan")),
    "float signalling NaN": b"\x00\x55\x01\x00\x80\x7f",
}
FAILING = {
    "empty payload": (b"", "message-index list"),
    "truncated index list": (b"\x04\x02", "message-index list"),
    "index count too large": (b"\x7e\x00", "message-index list"),
    "other message": (b"\x02\x02\x08\x01", "[1]"),
    "nested other message": (b"\x04\x02\x00\x08\x01", "t.Other.Deep"),
    "no such message": (b"\x02\x08", "no message"),
    "truncated message": (CANONICAL[:-1], "corrupt payload"),
    "trailing garbage": (CANONICAL + b"\xff", "corrupt payload"),
    "bad utf-8": (b"\x00\x12\x02\xff\xfe", "corrupt payload"),
}


def test_canonical_payload_is_exact() -> None:
    decoded = _check_round_trip(SMALL, [CANONICAL, b"\x00"])
    assert not decoded.keep_bytes.any()  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", list(NON_CANONICAL))
def test_non_canonical_payloads_keep_their_bytes(name: str) -> None:
    decoded = _check_round_trip(SMALL, [NON_CANONICAL[name], CANONICAL])
    assert decoded.errors == [None, None]  # type: ignore[attr-defined]
    assert decoded.keep_bytes.tolist() == [True, False]  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", list(FAILING))
def test_bad_payloads_fail_with_a_cause(name: str) -> None:
    payload, cause = FAILING[name]
    decoded = _check_round_trip(SMALL, [payload, CANONICAL])
    assert cause in (decoded.errors[0] or "")  # type: ignore[attr-defined]
    assert decoded.keep_bytes.tolist() == [True, False]  # type: ignore[attr-defined]
    assert decoded.values.to_pylist()[0] is None  # type: ignore[attr-defined]


def test_other_message_cause_names_indexes_and_messages() -> None:
    decoded = CODEC.decode(SMALL, _binary([b"\x04\x02\x00\x08\x01"]))
    assert decoded.errors[0] == (
        "message indexes [1, 0] name message t.Other.Deep; only the schema's first message "
        "(t.R) is decoded"
    )


def test_enum_number_without_name_round_trips() -> None:
    payload = b"\x00\x38\x07"  # e = 7
    decoded = _check_round_trip(SMALL, [payload])
    assert decoded.values.to_pylist()[0]["e"] == "7"  # type: ignore[attr-defined]
    assert not decoded.keep_bytes[0]  # type: ignore[attr-defined]


def test_proto2_closed_enum_unknown_value_and_bad_utf8() -> None:
    legacy = _class(V2)
    closed = b"\x00\x18\x01\x30\x09"  # r = 1, mode = 9 (not a Mode): an unknown field in proto2
    bad_string = b"\x00\x18\x01\x12\x02\xff\xfe"  # proto2 strings are not checked by upb
    fine = b"\x00" + legacy(r=1, a=7, s="hi").SerializeToString()
    decoded = _check_round_trip(V2, [closed, bad_string, fine])
    assert decoded.keep_bytes.tolist() == [True, True, False]  # type: ignore[attr-defined]
    assert decoded.errors[1] == "string field s is not UTF-8"  # type: ignore[attr-defined]
    assert decoded.values.to_pylist()[2]["a"] == 7  # type: ignore[attr-defined]


def test_timestamp_beyond_microseconds_fails() -> None:
    ts = timestamp_pb2.Timestamp(seconds=2**62)
    payload = b"\x00\x4a" + bytes([ts.ByteSize()]) + ts.SerializeToString()
    decoded = _check_round_trip(SMALL, [payload])
    assert "out of the microsecond range" in (decoded.errors[0] or "")  # type: ignore[attr-defined]


def test_read_indexes() -> None:
    assert read_indexes(b"\x00", 0, 1) == ([0], 1)
    assert read_indexes(b"\x06\x02\x00\x00", 0, 4) == ([1, 0, 0], 4)
    with pytest.raises(ValueError, match="count"):
        read_indexes(b"\x01", 0, 1)


# ---------------------------------------------------------------- as the pipeline uses it


def _many(count: int) -> list[bytes]:
    cls = _class(SMALL)
    out = []
    for i in range(count):
        message = cls(i=i, s=str(i) * (i % 5), nums=list(range(i % 4)), d=i / 3)
        message.m[f"k{i % 3}"] = i
        if i % 2:
            message.sub.x = i
            message.ts.seconds = i
        out.append(b"\x00" + message.SerializeToString(deterministic=True))
    out[777] = b"\x02\x02"  # a failure inside a later chunk
    out[2050] = b"\x00\x08\x00"  # non-canonical in the third chunk
    return out


def test_batches_across_chunks_slices_and_framing() -> None:
    payloads = _many(2600)
    decoded = _check_round_trip(SMALL, payloads)
    assert [i for i, e in enumerate(decoded.errors) if e] == [777]  # type: ignore[attr-defined]
    assert decoded.keep_bytes.nonzero()[0].tolist() == [777, 2050]  # type: ignore[attr-defined]
    sliced = CODEC.decode(SMALL, _binary(payloads).slice(1000, 100))
    assert sliced.values.to_pylist() == decoded.values.slice(1000, 100).to_pylist()  # type: ignore[attr-defined]
    framed = [b"\x00\x00\x00\x00\x03" + p for p in payloads[:50]]
    by_header = CODEC.decode_framed(SMALL, _binary(framed), 5)
    assert by_header.values.to_pylist() == decoded.values.slice(0, 50).to_pylist()  # type: ignore[attr-defined]
    empty = CODEC.decode(SMALL, _binary([]))
    assert len(empty.values) == 0 and empty.values.type == CODEC.arrow_type(SMALL)
    chunked = pa.chunked_array([decoded.values.slice(0, 10), decoded.values.slice(10, 10)])  # type: ignore[attr-defined]
    assert CODEC.encode(SMALL, chunked).to_pylist() == payloads[:20]


def test_encode_refuses_null_rows() -> None:
    decoded = CODEC.decode(SMALL, _binary([b"\x02\x02"]))
    with pytest.raises(ValueError, match="null row"):
        CODEC.encode(SMALL, decoded.values)


def test_pickled_codec_and_threads() -> None:
    payloads = _many(3000)
    codec = pickle.loads(pickle.dumps(ProtobufCodec()))
    reference = codec.decode(SMALL, _binary(payloads)).values.to_pylist()
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: codec.decode(SMALL, _binary(payloads)), range(4)))
    assert all(r.values.to_pylist() == reference for r in results)


def test_empty_top_level_message() -> None:
    schema = RegisteredSchema(8, "PROTOBUF", 'syntax = "proto3"; message Nothing {}')
    decoded = _check_round_trip(schema, [b"\x00", b"\x00\x08\x01", b"\x02\x02"])
    assert decoded.keep_bytes.tolist() == [False, True, True]  # type: ignore[attr-defined]
    assert decoded.values.to_pylist() == [{}, {}, None]  # type: ignore[attr-defined]


def test_nested_field_ids_match_arrow_metadata() -> None:
    arrow = CODEC.arrow_type(SMALL)
    type_ = CODEC.iceberg_type(SMALL, _no_refs)
    by_name = {f.name: f for f in type_.fields}  # type: ignore[attr-defined]
    assert isinstance(by_name["sub"], NestedField)
    assert arrow.field("sub").metadata[b"PARQUET:field_id"] == str(by_name["sub"].field_id).encode()
