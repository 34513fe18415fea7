"""The Protobuf codec's compiled encoder against the upb encoder it replaces: for any value,
``ProtobufCodec.encode`` gives the same bytes as the former encode (a upb message built per row,
serialized deterministically; :func:`_old_encode` is that code, unchanged), or raises the same
error; and a canonical payload decoded then encoded comes back byte for byte.

Values come from messages of ``protobuf_gen`` (the PROTO3 and PROTO2 schemas, the latter with a
group), serialized deterministically or by the liberal writer (non-canonical wire forms decode
to the same kinds of values), from arbitrary Arrow values of each schema's type (nulls where the
type allows them, NaNs, -0.0, unsorted and duplicate map keys, enum strings that are names,
numbers or neither, out-of-range unsigned values), and from hand-made edge cases.

``PROTOBUF_EXAMPLES`` sets the number of hypothesis examples (60 by default)."""

from __future__ import annotations

import decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from google.protobuf.message import Message
from hypothesis import given
from hypothesis import strategies as st

from bergstream.plugins.value_codecs.protobuf.encoder import compile_encoder, encoder_for
from tests.kits.protobuf_gen import LiberalWriter, messages
from tests.value_codecs.protobuf_kit import SETTINGS, SchemaSet, proto2_plain

#: Long tags, packed fixed-width values, wrappers and empties in maps, big nested messages.
EXTRA = """
syntax = "proto3";
package enc.extra;
import "google/protobuf/wrappers.proto";
import "google/protobuf/empty.proto";
import "google/protobuf/duration.proto";
message X {
  repeated fixed32 r_f32 = 1; repeated sfixed64 r_sf64 = 2; repeated float r_fl = 3;
  repeated uint64 r_u64 = 4; repeated sint32 r_si32 = 5; repeated uint32 r_u32 = 6;
  map<string, google.protobuf.Int64Value> m_w = 7; map<fixed64, google.protobuf.Empty> m_e = 8;
  map<int32, google.protobuf.Duration> m_d = 9; map<sfixed32, double> m_sd = 10;
  Big big = 536870911; repeated Big bigs = 300;
  repeated int32 unpacked = 11 [packed = false];
  oneof pick { google.protobuf.Empty e1 = 12; google.protobuf.Empty e2 = 13; bool b = 14; }
}
message Big { string text = 1; Big2 inner = 2; }
message Big2 { bytes blob = 1; repeated string words = 2; }
"""

KIT = SchemaSet(
    proto2_plain("enc.v2", "  repeated Mode packed_modes = 17 [packed = true];\n"),
    "extra",
    EXTRA,
)
CODEC = KIT.codec
SCHEMAS = KIT.schemas
_compiled = KIT.compiled


def _old_encode(compiled: Any, values: pa.Array) -> pa.Array:
    """The codec's encode before the compiled encoder (verbatim)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if values.null_count:
        raise ValueError("a null row has no Protobuf payload")
    make, fill = compiled.message, compiled.fill
    out = []
    for row in values.cast(compiled.plain).to_pylist():
        message = make()
        fill(message, row)
        out.append(b"\x00" + message.SerializePartialToString(deterministic=True))
    return pa.array(out, pa.large_binary())


def _outcome(encode: Any) -> tuple[str, Any]:
    try:
        result = encode()
    except Exception as exc:  # the old encode's errors must be the new one's (their kind:
        # a null in a required field is now named instead of Arrow's cast message)
        return "error", type(exc).__name__
    result.validate(full=True)
    return "ok", result.to_pylist()


def _same(name: str, values: pa.Array) -> tuple[str, Any]:
    """New and old encode of ``values`` agree; their outcome."""
    new = _outcome(lambda: CODEC.encode(SCHEMAS[name], values))
    old = _outcome(lambda: _old_encode(_compiled(name), values))
    assert new == old
    return new


def _round_trip(name: str, payloads: list[bytes]) -> None:
    """Decode ``payloads``; encoding the rows that decoded gives what the old encode gives,
    and each row that keeps no bytes gives back its payload."""
    decoded = CODEC.decode(SCHEMAS[name], pa.array(payloads, pa.large_binary()))
    rows = [i for i, error in enumerate(decoded.errors) if error is None]
    if not rows:
        return
    values = decoded.values.take(pa.array(rows))
    status, encoded = _same(name, values)
    assert status == "ok", encoded
    for row, payload in zip(rows, encoded, strict=True):
        if not decoded.keep_bytes[row]:
            assert payload == payloads[row]


# ---------------------------------------------------------------- messages of the generator


@pytest.mark.parametrize("name", ["v3", "v2", "v2plain", "extra"])
def test_canonical_payloads_come_back(name: str) -> None:
    """Deterministic serializations decode and encode back to themselves (and match the old
    encode); liberal ones give the old encode's bytes."""

    @SETTINGS
    @given(st.lists(messages(_compiled(name).message), min_size=1, max_size=6), st.randoms())
    def check(batch: list[Message], rng: Any) -> None:
        canonical = [b"\x00" + m.SerializePartialToString(deterministic=True) for m in batch]
        _round_trip(name, canonical)
        writer = LiberalWriter(rng)
        _round_trip(name, [b"\x00" + writer.write(m) for m in batch])

    check()


# ---------------------------------------------------------------- arbitrary Arrow values


def _enum_names(compiled: Any) -> list[str]:
    names: set[str] = set()
    seen: set[str] = set()
    stack = [compiled.descriptor]
    while stack:
        desc = stack.pop()
        if desc.full_name in seen:
            continue
        seen.add(desc.full_name)
        for field in desc.fields:
            if field.enum_type is not None:
                names.update(v.name for v in field.enum_type.values)
            if field.message_type is not None:
                stack.append(field.message_type)
    return sorted(names)


_ODD_ENUMS = ["0", "1", "2", "-3", "7", "-1", "2147483647", "-2147483648", "2147483648",
              "007", "-0", "+1", " 1", "1_0", "", "x", "\u0663"]  # fmt: skip


def _values(type_: pa.DataType, names: list[str]) -> st.SearchStrategy[Any]:
    """Python values of an Arrow type (timestamps as int64 microseconds)."""
    if pa.types.is_struct(type_):
        fields = {}
        for f in type_:
            value = _values(f.type, names)
            fields[f.name] = st.one_of(st.none(), value) if f.nullable else value
        return st.fixed_dictionaries(fields)
    if pa.types.is_map(type_):
        entry = st.tuples(_values(type_.key_type, names), _values(type_.item_type, names))
        return st.one_of(st.lists(entry, max_size=1), st.lists(entry, max_size=3))
    if pa.types.is_large_list(type_):
        return st.lists(_values(type_.value_type, names), max_size=3)
    if pa.types.is_int32(type_):
        return st.one_of(st.sampled_from([0, -1, 1, -(2**31), 2**31 - 1]),
                         st.integers(-(2**31), 2**31 - 1))  # fmt: skip
    if pa.types.is_int64(type_) or pa.types.is_timestamp(type_):
        return st.one_of(st.sampled_from([0, -1, 1, 2**32 - 1, 2**32, -(2**63), 2**63 - 1]),
                         st.integers(0, 2**32 - 1), st.integers(-(2**63), 2**63 - 1))  # fmt: skip
    if pa.types.is_float32(type_):
        return st.floats(width=32)
    if pa.types.is_float64(type_):
        return st.floats()
    if pa.types.is_boolean(type_):
        return st.booleans()
    if pa.types.is_large_string(type_):
        return st.one_of(st.sampled_from(names + _ODD_ENUMS), st.text(max_size=6))
    if pa.types.is_large_binary(type_):
        return st.binary(max_size=6)
    if pa.types.is_decimal(type_):
        return st.one_of(st.integers(0, 2**64 - 1), st.sampled_from([2**64 - 1, 2**64, -1]),
                         ).map(decimal.Decimal)  # fmt: skip
    raise AssertionError(f"no values for {type_}")


@pytest.mark.parametrize("name", ["v3", "v2", "v2plain", "extra"])
def test_arbitrary_values_encode_as_before(name: str) -> None:
    """Any value of the type (not only decoded ones) encodes as the old encode did, or fails
    the same way."""
    compiled = _compiled(name)
    rows = _values(compiled.plain, _enum_names(compiled))

    @SETTINGS
    @given(st.lists(rows, min_size=1, max_size=5), st.integers(0, 2))
    def check(batch: list[dict[str, Any]], cut: int) -> None:
        values = pa.array(batch, compiled.plain).cast(compiled.arrow)
        _same(name, values)
        if cut and len(values) > cut:
            _same(name, values.slice(cut))
            _same(name, pa.chunked_array([values.slice(0, cut), values.slice(cut)]))

    check()


# ---------------------------------------------------------------- edge cases


def _v3(**fields: Any) -> Message:
    message = _compiled("v3").message()
    for name, value in fields.items():
        setattr(message, name, value)
    return message


def _edge_messages() -> list[Message]:
    out = [_v3(), _v3(i32=-1, si32=-1, sf32=-1, color=-3, i64=-(2**63), u64=2**64 - 1)]
    out.append(_v3(f64=2**64 - 1, u32=2**32 - 1, f32=2**32 - 1, fl=-0.0, db=-0.0))
    out.append(_v3(st="", by=b"", opt_i=0, opt_s="", opt_c=0, bo=False))
    out.append(_v3(db=float("nan")))
    out.append(_v3(fl=float("-inf"), db=float("inf"), st="é€😀", by=b"\xff\x00"))
    for name in ("c_str", "c_long"):
        out.append(_v3(**{name: "" if name == "c_str" else 0}))
    m = _v3()
    m.c_inner.SetInParent()
    m.inner.deeper.SetInParent()
    m.empty.SetInParent()
    m.r_empty.add()
    m.r_inner.add()
    m.r_ts.add()
    m.ts.SetInParent()  # the epoch
    m.du.SetInParent()
    out.append(m)
    m = _v3()
    for wrapper in ("w_db", "w_fl", "w_i64", "w_u64", "w_i32", "w_u32", "w_bo", "w_st", "w_by"):
        getattr(m, wrapper).SetInParent()  # wrappers at their default
    m.r_w.add()
    m.w_db.value = -0.0
    out.append(m)
    m = _v3()
    m.w_u64.value = 2**64 - 1
    m.w_i32.value = -5
    m.ts.seconds, m.ts.nanos = -1, 999_999_000
    m.du.seconds, m.du.nanos = -3, -1000
    m.r_color.extend([0, -3, 1, 77])
    m.r_i32.extend([0, -1, 2**31 - 1])
    m.m_si[""] = 0
    m.m_bs[False] = ""
    m.m_uc[2**64 - 1] = -3
    m.m_ib[-1] = b""
    m.m_ts["t"].SetInParent()
    m.m_li[0].SetInParent()
    out.append(m)
    m = _v3(st="x" * 300, by=b"y" * 20_000)
    m.inner.name = "n" * 200
    m.inner.deeper.n = -1
    m.r_inner.add().name = "z" * 130
    m.r_st.extend(["a" * 127, "b" * 128, "c" * 16_384])
    m.r_i32.extend(range(-100, 100))
    m.m_li[-7].name = "long " * 60
    out.append(m)
    return out


def test_edge_cases_come_back() -> None:
    """Defaults, -0.0, NaN, negative int32 and enums, empty strings and messages, oneofs,
    wrappers and timestamps at their default, big unsigned values, long nested messages."""
    payloads = [b"\x00" + m.SerializeToString(deterministic=True) for m in _edge_messages()]
    for payload in payloads:
        _round_trip("v3", [payload])
    _round_trip("v3", payloads * 3)


def test_kernel_takes_canonical_rows() -> None:
    """The edge cases but NaN go through the kernel (so the comparisons exercise it); a map of
    two entries and two members of a oneof go to upb."""
    compiled = _compiled("v3")
    payloads = [b"\x00" + m.SerializeToString(deterministic=True) for m in _edge_messages()]
    decoded = CODEC.decode(SCHEMAS["v3"], pa.array(payloads, pa.large_binary()))
    encoder = encoder_for(compiled.message, compiled.descriptor, compiled.arrow)
    assert encoder is not None
    _, slow = encoder._encode(decoded.values)
    nan = [i for i, m in enumerate(_edge_messages()) if m.db != m.db]
    assert np.flatnonzero(slow).tolist() == nan

    m = _v3()
    m.m_si["a"] = 1
    m.m_si["b"] = 2
    two = CODEC.decode(SCHEMAS["v3"], pa.array([b"\x00" + m.SerializeToString()],
                                                pa.large_binary())).values  # fmt: skip
    assert encoder._encode(two)[1].tolist() == [True]
    assert _same("v3", two)[0] == "ok"
    empty = CODEC.decode(SCHEMAS["v3"], pa.array([b"\x00"], pa.large_binary())).values
    row = empty.cast(compiled.plain).to_pylist()[0]
    row.update(c_str="a", c_long=1)
    both = pa.array([row], compiled.plain).cast(compiled.arrow)
    assert encoder._encode(both)[1].tolist() == [True]
    _same("v3", both)


def test_every_schema_compiles() -> None:
    """The test schemas (a group included) all have a program."""
    for name in SCHEMAS:
        assert compile_encoder(_compiled(name).descriptor) is not None


def test_nulls_the_type_has_not() -> None:
    """A null where the type has none (a required field) sends the batch to upb (which fails
    as before); one under a null struct is never visited, so the batch encodes as the same
    value without it would (where the old encode failed: casting to its own type refuses it)."""
    compiled = _compiled("extra")
    empty = CODEC.decode(SCHEMAS["extra"], pa.array([b"\x00"] * 2, pa.large_binary())).values
    big_type = compiled.arrow.field("big").type
    inner_type = big_type.field("inner").type
    inner = pa.StructArray.from_arrays(
        [pa.array([b"", b""], pa.large_binary()), pa.array([[], []], inner_type.field(1).type)],
        fields=list(inner_type), mask=pa.array([True, True]),
    )  # fmt: skip

    def with_big(text: list[str | None], null_big: bool) -> pa.Array:
        mask = pa.array([False, null_big])
        big = pa.StructArray.from_arrays([pa.array(text, pa.large_string()), inner],
                                         fields=list(big_type), mask=mask)  # fmt: skip
        children = [big if f.name == "big" else empty.field(f.name) for f in compiled.arrow]
        return pa.StructArray.from_arrays(children, fields=list(compiled.arrow))

    hidden = CODEC.encode(SCHEMAS["extra"], with_big(["t", None], True))
    assert hidden.to_pylist() == _old_encode(compiled, with_big(["t", "t"], True)).to_pylist()
    encoder = encoder_for(compiled.message, compiled.descriptor, compiled.arrow)
    assert encoder is not None
    assert not encoder._encode(with_big(["t", None], True))[1].any()
    assert _same("extra", with_big(["t", None], False))[0] == "error"
