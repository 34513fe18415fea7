"""Test schemas for the Protobuf codec, a hypothesis strategy of messages of any of their
descriptors, and an independent, row-by-row reference of the values the codec should decode."""

from __future__ import annotations

import datetime as dt
import decimal
import itertools
import random
import struct
from dataclasses import dataclass
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
        # proto2 required fields are always set (serializers refuse a message without them)
        if not field.is_required and not draw(st.booleans()):
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


# ---------------------------------------------------------------- generated message schemas

#: Scalar type names of the .proto language.
SCALAR_NAMES = (
    "int32", "sint32", "sfixed32", "int64", "sint64", "sfixed64", "uint32", "fixed32",
    "uint64", "fixed64", "float", "double", "bool", "string", "bytes",
)  # fmt: skip
#: Scalar types a map key may have.
MAP_KEY_NAMES = tuple(n for n in SCALAR_NAMES if n not in ("float", "double", "bytes"))
#: Well-known message types (full name -> the file declaring it).
WELL_KNOWN_FILES = {
    "google.protobuf.Timestamp": "google/protobuf/timestamp.proto",
    "google.protobuf.Duration": "google/protobuf/duration.proto",
    "google.protobuf.Empty": "google/protobuf/empty.proto",
    **{
        f"google.protobuf.{kind}Value": "google/protobuf/wrappers.proto"
        for kind in ("Double", "Float", "Int64", "UInt64", "Int32", "UInt32", "Bool", "String",
                     "Bytes")
    },
}  # fmt: skip
_WELL_KNOWN_NAMES = tuple(WELL_KNOWN_FILES)
_PACKABLE = frozenset(n for n in SCALAR_NAMES if n not in ("string", "bytes"))
# Field numbers protobuf reserves for itself.
_RESERVED = range(19000, 20000)
_MAX_NUMBER = 2**29 - 1


@dataclass(frozen=True)
class GenEnum:
    """An enum of a generated schema: its name and (value name, number) pairs."""

    name: str
    values: tuple[tuple[str, int], ...]

    def render(self, indent: str) -> str:
        """The enum's .proto text."""
        body = " ".join(f"{name} = {number};" for name, number in self.values)
        return f"{indent}enum {self.name} {{ {body} }}\n"


@dataclass(frozen=True)
class GenField:
    """A field of a generated message: ``label`` is ``""``, ``optional``, ``required`` or
    ``repeated``; ``type`` a scalar, an enum or message name (nested ones unqualified) or
    ``map<k, v>``; ``group`` the body of a proto2 group (``type`` is then its name)."""

    label: str
    type: str
    name: str
    number: int
    options: str = ""
    group: GenMessage | None = None

    def render(self, indent: str) -> str:
        """The field's .proto text."""
        label = f"{self.label} " if self.label else ""
        options = f" [{self.options}]" if self.options else ""
        if self.group is not None:
            body = self.group.body(indent + "  ")
            return (
                f"{indent}{label}group {self.type} = {self.number}{options} {{\n{body}{indent}}}\n"
            )
        return f"{indent}{label}{self.type} {self.name} = {self.number}{options};\n"


@dataclass(frozen=True)
class GenMessage:
    """A generated message: fields, oneofs (name, members), nested messages and enums."""

    name: str
    fields: tuple[GenField, ...]
    oneofs: tuple[tuple[str, tuple[GenField, ...]], ...] = ()
    messages: tuple[GenMessage, ...] = ()
    enums: tuple[GenEnum, ...] = ()

    def body(self, indent: str) -> str:
        """The declarations inside the message's braces."""
        out = [f.render(indent) for f in self.fields]
        for name, members in self.oneofs:
            inner = "".join(f.render(indent + "  ") for f in members)
            out.append(f"{indent}oneof {name} {{\n{inner}{indent}}}\n")
        out += [m.render(indent) for m in self.messages]
        out += [e.render(indent) for e in self.enums]
        return "".join(out)

    def render(self, indent: str = "") -> str:
        """The message's .proto text."""
        return f"{indent}message {self.name} {{\n{self.body(indent + '  ')}{indent}}}\n"

    def imports(self) -> list[str]:
        """The well-known files the message needs, sorted."""
        found: list[str] = []
        stack: list[GenMessage] = [self]
        while stack:
            message = stack.pop()
            stack += message.messages
            fields = [*message.fields, *(f for _, members in message.oneofs for f in members)]
            for field in fields:
                if field.group is not None:
                    stack.append(field.group)
                for name, path in WELL_KNOWN_FILES.items():
                    if name in field.type and path not in found:
                        found.append(path)
        return sorted(found)


def proto_file(syntax: str, package: str, messages: list[GenMessage], imports: list[str]) -> str:
    """A .proto file declaring ``messages`` (in order) in ``package``."""
    lines = [f'syntax = "{syntax}";\n', f"package {package};\n"]
    lines += [f'import "{path}";\n' for path in imports]
    return "".join(lines) + "".join(m.render() for m in messages)


def _default_text(type_name: str, draw: st.DrawFn, enum: GenEnum | None) -> str:
    """A proto2 ``[default = ...]`` value of a scalar or enum field."""
    if enum is not None:
        return draw(st.sampled_from([name for name, _ in enum.values]))
    if type_name in ("float", "double"):
        return draw(st.sampled_from(["1.5", "-2.25", "0", "1e10", "inf", "-inf"]))
    if type_name == "bool":
        return draw(st.sampled_from(["true", "false"]))
    if type_name in ("string", "bytes"):
        return '"' + draw(st.text("abcxyz", max_size=4)) + '"'
    low, high = _INT_RANGES[_TYPE_OF_NAME[type_name]]
    return str(draw(_edge_ints(low, high)))


_TYPE_OF_NAME = {
    "int32": F.TYPE_INT32, "sint32": F.TYPE_SINT32, "sfixed32": F.TYPE_SFIXED32,
    "int64": F.TYPE_INT64, "sint64": F.TYPE_SINT64, "sfixed64": F.TYPE_SFIXED64,
    "uint32": F.TYPE_UINT32, "fixed32": F.TYPE_FIXED32, "uint64": F.TYPE_UINT64,
    "fixed64": F.TYPE_FIXED64,
}  # fmt: skip


def _field_numbers(count: int) -> st.SearchStrategy[list[int]]:
    """``count`` distinct field numbers, mostly small, some with long tags."""
    number = st.one_of(
        st.integers(1, 40), st.integers(1, _MAX_NUMBER).filter(lambda n: n not in _RESERVED)
    )
    return st.lists(number, min_size=count, max_size=count, unique=True)


@st.composite
def _enum(draw: st.DrawFn, name: str, syntax: str) -> GenEnum:
    """An enum (proto3: first value 0; proto2: often too, else any numbers)."""
    count = draw(st.integers(1, 4))
    numbers = draw(
        st.lists(st.integers(-5, 2**31 - 1) | st.integers(-(2**31), 5), min_size=count,
                 max_size=count, unique=True)
    )  # fmt: skip
    if syntax == "proto3" or draw(st.booleans()):
        numbers = [0, *(n for n in numbers if n != 0)][:count]
    return GenEnum(name, tuple((f"{name.upper()}_V{k}", n) for k, n in enumerate(numbers)))


@st.composite
def message_schemas(
    draw: st.DrawFn, name: str, syntax: str = "proto3", depth: int = 0
) -> GenMessage:
    """A message named ``name``: every scalar, enums, nested messages (two levels at most),
    well-known types, proto3 ``optional`` or proto2 labels and defaults, oneofs, repeated
    fields (packed and not), maps and (proto2) groups; field numbers in no particular order
    and not dense. Not recursive; every message has a field."""
    enums = [draw(_enum(f"K{k}", syntax)) for k in range(draw(st.integers(0, 2)))]
    count = draw(st.integers(1, 6 if depth == 0 else 3))
    numbers = draw(_field_numbers(count))
    nested: list[GenMessage] = []
    fields: list[GenField] = []
    oneof_members: list[GenField] = []

    def value_type(in_map: bool = False) -> tuple[str, GenEnum | None]:
        # a map's values may not be of an enum whose first value is not 0
        usable = [e for e in enums if not in_map or e.values[0][1] == 0]
        kinds = ["scalar", "scalar", "well-known"]
        kinds += ["enum"] * bool(usable) + ["message"] * (depth < 2)
        kind = draw(st.sampled_from(kinds))
        if kind == "scalar":
            return draw(st.sampled_from(SCALAR_NAMES)), None
        if kind == "well-known":
            return draw(st.sampled_from(_WELL_KNOWN_NAMES)), None
        if kind == "enum":
            enum = draw(st.sampled_from(usable))
            return enum.name, enum
        child = draw(message_schemas(f"N{len(nested)}", syntax, depth + 1))
        nested.append(child)
        return child.name, None

    for k, number in enumerate(numbers):
        shape = draw(st.sampled_from(["single", "single", "repeated", "map", "oneof"]
                                     + ["group"] * (syntax == "proto2" and depth < 2)))  # fmt: skip
        if shape == "group":
            body = draw(message_schemas(f"G{k}", syntax, depth + 1))
            label = draw(st.sampled_from(["optional", "repeated"]))
            group = GenMessage(f"G{k}", body.fields, body.oneofs, body.messages, body.enums)
            fields.append(GenField(label, f"G{k}", f"g{k}", number, group=group))
            continue
        if shape == "map":
            key = draw(st.sampled_from(MAP_KEY_NAMES))
            value, _ = value_type(in_map=True)
            fields.append(GenField("", f"map<{key}, {value}>", f"f{k}_map", number))
            continue
        type_name, enum = value_type()
        field_name = f"f{k}_{type_name.rsplit('.', 1)[-1].lower()}"
        is_value = type_name in SCALAR_NAMES or enum is not None
        if shape == "oneof":
            oneof_members.append(GenField("", type_name, field_name, number))
            continue
        options = ""
        if shape == "repeated":
            label = "repeated"
            if type_name in _PACKABLE or enum is not None:
                packed = draw(st.sampled_from(["", "packed = true", "packed = false"]))
                options = packed
        elif syntax == "proto2":
            label = draw(st.sampled_from(["optional", "optional", "required"]))
            if label == "optional" and is_value and draw(st.booleans()):
                options = f"default = {_default_text(type_name, draw, enum)}"
        else:
            label = draw(st.sampled_from(["", "", "optional"])) if is_value else ""
        fields.append(GenField(label, type_name, field_name, number, options))
    oneofs: tuple[tuple[str, tuple[GenField, ...]], ...] = ()
    if oneof_members:
        split = draw(st.integers(0, len(oneof_members)))
        parts = [oneof_members[:split], oneof_members[split:]]
        oneofs = tuple((f"o{k}", tuple(p)) for k, p in enumerate(parts) if p)
    return GenMessage(name, tuple(fields), oneofs, tuple(nested), tuple(enums))


def compile_files(files: dict[str, str], pool: Any, workdir: str) -> None:
    """Compile ``files`` (import path -> .proto text; importing well-known files or each
    other) with grpcio-tools' protoc and add them, in order, to ``pool`` (which must hold the
    well-known files they import). Raises ``AssertionError`` if protoc fails."""
    import os

    import grpc_tools
    from google.protobuf import descriptor_pb2
    from grpc_tools import _protoc_compiler

    for path, text in files.items():
        with open(os.path.join(workdir, path), "w", encoding="utf-8") as out:
            out.write(text)
    target = os.path.join(workdir, "out.desc")
    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    args = [b"protoc", f"-I{workdir}".encode(), f"-I{include}".encode(),
            f"--descriptor_set_out={target}".encode(), *(p.encode() for p in files)]  # fmt: skip
    assert _protoc_compiler.run_main(args) == 0, f"protoc failed on {list(files)}"
    with open(target, "rb") as produced:
        compiled = descriptor_pb2.FileDescriptorSet.FromString(produced.read())
    by_name = {f.name: f for f in compiled.file}
    for path in files:
        pool.Add(by_name[path])


def standalone_class(message: GenMessage, syntax: str, workdir: str) -> type[Message]:
    """The message class of ``message`` alone in a file of its own, in a new private pool."""
    from google.protobuf import (
        descriptor_pool,
        duration_pb2,
        empty_pb2,
        timestamp_pb2,
        wrappers_pb2,
    )
    from google.protobuf.message_factory import GetMessageClass

    pool = descriptor_pool.DescriptorPool()
    for module in (timestamp_pb2, duration_pb2, empty_pb2, wrappers_pb2):
        pool.AddSerializedFile(module.DESCRIPTOR.serialized_pb)
    path = f"standalone_{message.name.lower()}.proto"
    text = proto_file(syntax, "gen.standalone", [message], message.imports())
    compile_files({path: text}, pool, workdir)
    return GetMessageClass(pool.FindMessageTypeByName(f"gen.standalone.{message.name}"))


# ---------------------------------------------------------------- liberal wire encoding

_FIXED = {
    F.TYPE_FIXED32: "<I", F.TYPE_SFIXED32: "<i", F.TYPE_FLOAT: "<f",
    F.TYPE_FIXED64: "<Q", F.TYPE_SFIXED64: "<q", F.TYPE_DOUBLE: "<d",
}  # fmt: skip
_VARINT, _I64, _LEN, _START, _END, _I32 = range(6)


def varint(number: int, pad: int = 0) -> bytes:
    """``number`` (0 <= number < 2**64) as a varint, ``pad`` redundant zero groups longer."""
    groups = []
    while True:
        groups.append(number & 0x7F)
        number >>= 7
        if not number:
            break
    groups += [0] * pad
    return bytes(g | 0x80 for g in groups[:-1]) + bytes(groups[-1:])


def _tag(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


class LiberalWriter:
    """Writes a message's wire bytes with the liberties parsers must accept (each drawn with
    ``draw``): fields in any order, a singular field written twice (the last wins), explicit
    proto3 defaults, packed fields unpacked or split into chunks (empty ones too) and unpacked
    fields packed, non-minimal varints, unknown fields, map entries in any order, with the
    value before the key, with a default key or value omitted, or after an overridden entry of
    the same key. The bytes mean exactly the message written. The choices come from ``rng``
    (in a hypothesis test, ``st.randoms(use_true_random=True)``: one draw, not hundreds)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def _flip(self) -> bool:
        return self.rng.random() < 0.5

    def write(self, message: Message) -> bytes:
        """The liberal bytes of ``message`` (without a length prefix)."""
        desc = message.DESCRIPTOR
        chunks = [self._field(message, field) for field in desc.fields]
        used = set(desc.fields_by_number)
        for _ in range(self.rng.randint(0, 2)):
            number = self.rng.choice([self.rng.randint(1, 40), self.rng.randint(1, _MAX_NUMBER)])
            if number not in used and number not in _RESERVED:
                chunks.append(self._unknown(number))
        order = self.rng.sample(range(len(chunks)), len(chunks))
        return b"".join(chunks[i] for i in order)

    def _pad(self, number: int) -> bytes:
        """A varint, sometimes non-minimal (never longer than 10 bytes)."""
        minimal = len(varint(number))
        pad = self.rng.randint(0, 10 - minimal) if self._flip() else 0
        return varint(number, pad)

    def _unknown(self, number: int) -> bytes:
        wire = self.rng.choice([_VARINT, _I64, _LEN, _I32])
        if wire == _VARINT:
            body = varint(self.rng.randrange(2**64))
        elif wire == _LEN:
            data = self.rng.randbytes(self.rng.randint(0, 6))
            body = varint(len(data)) + data
        else:
            body = self.rng.randbytes(8 if wire == _I64 else 4)
        return _tag(number, wire) + body

    def _value(self, field: FieldDescriptor, value: Any) -> tuple[int, bytes]:
        """One value of ``field``: its wire type and bytes (length-prefixed if LEN)."""
        kind = field.type
        if kind in _FIXED:
            return (_I32 if _FIXED[kind][1] in "Iif" else _I64), struct.pack(_FIXED[kind], value)
        if kind in (F.TYPE_SINT32, F.TYPE_SINT64):
            return _VARINT, self._pad(2 * value if value >= 0 else -2 * value - 1)
        if kind in (F.TYPE_STRING, F.TYPE_BYTES):
            data = value.encode("utf-8") if kind == F.TYPE_STRING else value
            return _LEN, varint(len(data)) + data
        if kind == F.TYPE_GROUP:
            return _START, self.write(value)
        if kind == F.TYPE_MESSAGE:
            data = self.write(value)
            return _LEN, varint(len(data)) + data
        return _VARINT, self._pad(int(value) & (2**64 - 1))

    def _one(self, field: FieldDescriptor, value: Any, number: int | None = None) -> bytes:
        """One value of ``field`` with its tag (a group with its end tag)."""
        number = field.number if number is None else number
        wire, data = self._value(field, value)
        if wire == _START:
            return _tag(number, _START) + data + _tag(number, _END)
        return _tag(number, wire) + data

    def _field(self, message: Message, field: FieldDescriptor) -> bytes:
        value = getattr(message, field.name)
        if _is_map(field):
            return self._map(field, value)
        if field.is_repeated:
            return self._repeated(field, list(value))
        if field.has_presence:
            if not message.HasField(field.name):
                return b""
            present = True
        else:
            present = self._value(field, value)[1] != self._value(field, field.default_value)[1]
        out = b""
        if field.message_type is None and present and self._flip():
            out += self._one(field, self._decoy(field))  # overridden below
        if present or self._flip():
            out += self._one(field, value)
        return out

    def _repeated(self, field: FieldDescriptor, values: list[Any]) -> bytes:
        packable = field.message_type is None and field.type not in (F.TYPE_STRING, F.TYPE_BYTES)
        if not packable:
            return b"".join(self._one(field, v) for v in values)
        mode = self.rng.choice(["packed", "unpacked", "split"])
        if mode == "unpacked":
            return b"".join(self._one(field, v) for v in values)
        cuts = [0, len(values)]
        if mode == "split":
            cuts += [self.rng.randint(0, len(values)) for _ in range(self.rng.randint(0, 3))]
        cuts.sort()
        out = b""
        for start, end in itertools.pairwise(cuts):
            body = b"".join(self._value(field, v)[1] for v in values[start:end])
            if body or mode == "split" or not values:
                out += _tag(field.number, _LEN) + varint(len(body)) + body
        return out if values or self._flip() else b""

    def _map(self, field: FieldDescriptor, container: Any) -> bytes:
        keys = sorted(container.keys())  # upb iterates a map in an order of its own
        order = self.rng.sample(range(len(keys)), len(keys))
        out = b""
        for i in order:
            key = keys[i]
            if self.rng.random() < 0.25:
                out += self._entry(field, key, None)  # overridden by the next entry
            out += self._entry(field, key, container[key])
        return out

    def _entry(self, field: FieldDescriptor, key: Any, value: Any) -> bytes:
        """One entry of map ``field`` (``value`` None: the value omitted, so its default)."""
        entry = field.message_type
        key_field, value_field = entry.fields_by_name["key"], entry.fields_by_name["value"]
        parts = []
        if key != key_field.default_value or self._flip():
            parts.append(self._one(key_field, key))
        if value is not None:
            if value_field.message_type is not None:
                default = value.ByteSize() == 0
            else:
                written = self._value(value_field, value)[1]
                default = written == self._value(value_field, value_field.default_value)[1]
            if not default or self._flip():
                parts.append(self._one(value_field, value))
        if self._flip():
            parts.reverse()
        body = b"".join(parts)
        return _tag(field.number, _LEN) + varint(len(body)) + body

    def _decoy(self, field: FieldDescriptor) -> Any:
        """Some value of a scalar or enum field (which a later one overrides)."""
        if field.type in _INT_RANGES:
            return self.rng.randint(*_INT_RANGES[field.type])
        if field.type in (F.TYPE_FLOAT, F.TYPE_DOUBLE):
            return float(self.rng.randint(-100, 100))
        if field.type == F.TYPE_BOOL:
            return self._flip()
        if field.type == F.TYPE_STRING:
            return self.rng.choice(["", "x", "décoy"])
        if field.type == F.TYPE_BYTES:
            return self.rng.randbytes(self.rng.randint(0, 3))
        return self.rng.choice([v.number for v in field.enum_type.values])
