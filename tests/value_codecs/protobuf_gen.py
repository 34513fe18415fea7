"""Test schemas for the Protobuf codec, a hypothesis strategy of messages of any of their
descriptors, and an independent, row-by-row reference of the values the codec should decode."""

from __future__ import annotations

import datetime as dt
import decimal
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import strategies as st

F = FieldDescriptor

#: proto3: every scalar, enum, optional, oneof, repeated, maps, nested, well-known types.
PROTO3 = """
syntax = "proto3";
package gen.v3;
import "google/protobuf/timestamp.proto";
import "google/protobuf/duration.proto";
import "google/protobuf/wrappers.proto";
import "google/protobuf/empty.proto";

message All {
  int32 i32 = 1; sint32 si32 = 2; sfixed32 sf32 = 3;
  int64 i64 = 4; sint64 si64 = 5; sfixed64 sf64 = 6;
  uint32 u32 = 7; fixed32 f32 = 8; uint64 u64 = 9; fixed64 f64 = 10;
  float fl = 11; double db = 12; bool bo = 13; string st = 14; bytes by = 15;
  Color color = 16;
  optional int32 opt_i = 17; optional string opt_s = 18; optional Color opt_c = 19;
  oneof choice { string c_str = 20; Inner c_inner = 21; int64 c_long = 22; }
  Inner inner = 23;
  repeated int32 r_i32 = 24; repeated sint64 r_si64 = 25; repeated double r_db = 26;
  repeated bool r_bo = 27; repeated string r_st = 28; repeated bytes r_by = 29;
  repeated Color r_color = 30; repeated Inner r_inner = 31; repeated fixed64 r_f64 = 32;
  map<string, int32> m_si = 33; map<int64, Inner> m_li = 34; map<bool, string> m_bs = 35;
  map<uint64, Color> m_uc = 36; map<string, google.protobuf.Timestamp> m_ts = 37;
  map<sint32, bytes> m_ib = 38;
  google.protobuf.Timestamp ts = 39; google.protobuf.Duration du = 40;
  repeated google.protobuf.Timestamp r_ts = 41;
  google.protobuf.DoubleValue w_db = 42; google.protobuf.FloatValue w_fl = 43;
  google.protobuf.Int64Value w_i64 = 44; google.protobuf.UInt64Value w_u64 = 45;
  google.protobuf.Int32Value w_i32 = 46; google.protobuf.UInt32Value w_u32 = 47;
  google.protobuf.BoolValue w_bo = 48; google.protobuf.StringValue w_st = 49;
  google.protobuf.BytesValue w_by = 50; google.protobuf.Empty empty = 51;
  repeated google.protobuf.Empty r_empty = 52; repeated google.protobuf.Int32Value r_w = 53;
}
enum Color { RED = 0; GREEN = 1; BLUE = 2; DARK = -3; }
message Inner {
  string name = 1;
  repeated Color tags = 2;
  Deeper deeper = 3;
  message Deeper { int64 n = 1; google.protobuf.Duration d = 2; }
}
message Second { int32 z = 1; }
"""

#: proto2: presence everywhere, defaults, required, closed enums, unpacked and packed, a group.
PROTO2 = """
syntax = "proto2";
package gen.v2;
message Legacy {
  optional int32 a = 1 [default = 7];
  optional string s = 2 [default = "hi"];
  required int64 r = 3;
  repeated int32 unpacked = 4;
  repeated sint32 packed = 5 [packed = true];
  enum Mode { SLOW = 1; FAST = 2; }
  optional Mode mode = 6;
  repeated Mode modes = 7;
  optional group Grp = 8 { optional int32 g = 9; repeated string gs = 10; }
  optional bytes b = 11;
  optional double d = 12;
  optional uint32 u = 13;
  enum Level { NONE = 0; HIGH = 1; }
  map<string, Level> by_name = 14;
}
"""

_INT_RANGES: dict[int, tuple[int, int]] = {
    F.TYPE_INT32: (-(2**31), 2**31 - 1),
    F.TYPE_SINT32: (-(2**31), 2**31 - 1),
    F.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    F.TYPE_INT64: (-(2**63), 2**63 - 1),
    F.TYPE_SINT64: (-(2**63), 2**63 - 1),
    F.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    F.TYPE_UINT32: (0, 2**32 - 1),
    F.TYPE_FIXED32: (0, 2**32 - 1),
    F.TYPE_UINT64: (0, 2**64 - 1),
    F.TYPE_FIXED64: (0, 2**64 - 1),
}
_WRAPPER_VALUE = "value"
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _edge_ints(low: int, high: int) -> st.SearchStrategy[int]:
    edges = [v for v in (0, 1, -1, low, high, 127, 128, -129) if low <= v <= high]
    return st.one_of(st.sampled_from(edges), st.integers(low, high))


def scalar_values(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    """Values of a scalar or enum field (open enums include numbers without a name)."""
    if field.type in _INT_RANGES:
        return _edge_ints(*_INT_RANGES[field.type])
    if field.type == F.TYPE_FLOAT:
        return st.floats(width=32, allow_nan=False)
    if field.type == F.TYPE_DOUBLE:
        return st.floats(allow_nan=False)
    if field.type == F.TYPE_BOOL:
        return st.booleans()
    if field.type == F.TYPE_STRING:
        return st.text(max_size=8)
    if field.type == F.TYPE_BYTES:
        return st.binary(max_size=8)
    if field.type == F.TYPE_ENUM:
        known = st.sampled_from([v.number for v in field.enum_type.values])
        if field.enum_type.is_closed:
            return known
        return st.one_of(known, st.integers(-(2**31), 2**31 - 1))
    raise AssertionError(f"not a scalar: {field.full_name}")


def _is_map(field: FieldDescriptor) -> bool:
    return bool(
        field.is_repeated
        and field.message_type is not None
        and field.message_type.GetOptions().map_entry
    )


@st.composite
def _fill(draw: st.DrawFn, message: Message, depth: int = 0) -> None:
    """Set a random subset of ``message``'s fields to random values."""
    desc = message.DESCRIPTOR
    name = desc.full_name
    if name == "google.protobuf.Timestamp":
        message.seconds = draw(st.integers(-62135596800, 253402300799))  # type: ignore[attr-defined]
        message.nanos = draw(st.integers(0, 999_999)) * 1000  # type: ignore[attr-defined]
        return
    if name == "google.protobuf.Duration":
        micros = draw(st.integers(-(10**15), 10**15))
        sign = -1 if micros < 0 else 1
        seconds, rest = divmod(abs(micros), 1_000_000)
        message.seconds, message.nanos = sign * seconds, sign * rest * 1000  # type: ignore[attr-defined]
        return
    for field in desc.fields:
        if not draw(st.booleans()):
            continue
        if field.containing_oneof is not None and message.WhichOneof(field.containing_oneof.name):
            continue
        if _is_map(field):
            entry = field.message_type
            key_field, value_field = entry.fields_by_name["key"], entry.fields_by_name["value"]
            container = getattr(message, field.name)
            for key in draw(st.lists(scalar_values(key_field), max_size=4)):
                if value_field.message_type is not None:
                    target = container[key]
                    draw(_fill(target, depth + 1))
                else:
                    container[key] = draw(scalar_values(value_field))
        elif field.is_repeated:
            container = getattr(message, field.name)
            count = draw(st.integers(0, 3))
            for _ in range(count):
                if field.message_type is not None:
                    draw(_fill(container.add(), depth + 1))
                else:
                    container.append(draw(scalar_values(field)))
        elif field.message_type is not None:
            target = getattr(message, field.name)
            target.SetInParent()
            draw(_fill(target, depth + 1))
        else:
            setattr(message, field.name, draw(scalar_values(field)))


@st.composite
def messages(draw: st.DrawFn, message_class: type[Message]) -> Message:
    """A random message of ``message_class``."""
    message = message_class()
    draw(_fill(message))
    return message


def expected(message: Message) -> dict[str, Any]:
    """The value the codec should decode ``message`` to (as ``to_pylist`` gives it)."""
    return {field.name: _field_value(message, field) for field in message.DESCRIPTOR.fields}


def _field_value(message: Message, field: FieldDescriptor) -> Any:
    value = getattr(message, field.name)
    if _is_map(field):
        entry = field.message_type
        key_field, value_field = entry.fields_by_name["key"], entry.fields_by_name["value"]
        return [(_one(key_field, k), _one(value_field, value[k])) for k in sorted(value.keys())]
    if field.is_repeated:
        return [_one(field, item) for item in value]
    if field.has_presence and not message.HasField(field.name):
        return None
    return _one(field, value)


def _one(field: FieldDescriptor, value: Any) -> Any:
    if field.type == F.TYPE_ENUM:
        named = field.enum_type.values_by_number.get(value)
        return named.name if named is not None else str(value)
    if field.type in (F.TYPE_UINT64, F.TYPE_FIXED64):
        return decimal.Decimal(value)
    if field.message_type is None:
        return value
    desc: Descriptor = field.message_type
    if desc.full_name == "google.protobuf.Timestamp":
        micros = value.seconds * 1_000_000 + value.nanos // 1000
        return _EPOCH + dt.timedelta(microseconds=micros)
    if desc.full_name == "google.protobuf.Duration":
        return value.seconds * 1_000_000 + value.nanos // 1000
    if desc.full_name.startswith("google.protobuf.") and desc.full_name.endswith("Value"):
        return _one(desc.fields_by_name[_WRAPPER_VALUE], value.value)
    if not desc.fields:
        return True
    return expected(value)
