"""The Iceberg type of a Protobuf message (the design's "Protobuf -> Iceberg" rule).

message -> struct (fields in declaration order, named as in the .proto); repeated -> list;
map -> map; enum -> string (the value's name; a number the enum does not name -> its decimal
digits, e.g. ``"7"``, which no name can be, so it is given back exactly); oneof members -> one
optional field each. Scalars: int32 / sint32 / sfixed32 -> int; int64 / sint64 / sfixed64 ->
long; uint32 / fixed32 -> long; uint64 / fixed64 -> decimal(20, 0); float; double; bool;
string; bytes -> binary.

Well-known types: ``google.protobuf.Timestamp`` -> timestamptz (microseconds: nanoseconds
below a microsecond are lost, so such rows keep their bytes); ``google.protobuf.Duration`` ->
long microseconds (likewise); the wrappers (``Int32Value``, ``StringValue``, ...) -> their
scalar, null when absent. A message without fields (``google.protobuf.Empty``) inside another
one -> boolean, true when present (Parquet cannot store an empty struct). Groups are messages.
A recursive message (``google.protobuf.Struct`` and ``Value`` are) raises
:class:`SchemaNotExpressible` naming it.

Nullability follows protobuf presence: a field with presence (a message, a wrapper, a proto3
``optional``, a oneof member, any proto2 singular field including ``required`` ones, which upb
does not enforce) is optional and null when absent. A proto3 field without presence is required:
absent reads as its default (0, "", false, the enum's first name), which is what the protobuf
runtime reports and what re-encoding omits. Repeated fields and maps are required (absent =
empty); list elements and map values are required (protobuf has no null element). Field ids are
placeholders, unique within the type, assigned in pre-order.
"""

from __future__ import annotations

import itertools

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestamptzType,
)

from bergstream.core.api import SchemaNotExpressible

__all__ = [
    "DURATION",
    "SCALAR_TYPES",
    "TIMESTAMP",
    "WRAPPERS",
    "iceberg_type",
    "is_map",
    "is_optional",
    "message_kind",
]

F = FieldDescriptor

#: Scalar field type -> Iceberg type.
SCALAR_TYPES: dict[int, IcebergType] = {
    F.TYPE_INT32: IntegerType(),
    F.TYPE_SINT32: IntegerType(),
    F.TYPE_SFIXED32: IntegerType(),
    F.TYPE_INT64: LongType(),
    F.TYPE_SINT64: LongType(),
    F.TYPE_SFIXED64: LongType(),
    F.TYPE_UINT32: LongType(),
    F.TYPE_FIXED32: LongType(),
    F.TYPE_UINT64: DecimalType(20, 0),
    F.TYPE_FIXED64: DecimalType(20, 0),
    F.TYPE_FLOAT: FloatType(),
    F.TYPE_DOUBLE: DoubleType(),
    F.TYPE_BOOL: BooleanType(),
    F.TYPE_STRING: StringType(),
    F.TYPE_BYTES: BinaryType(),
}

TIMESTAMP = "google.protobuf.Timestamp"
DURATION = "google.protobuf.Duration"
#: Wrapper message -> the field type of its ``value``.
WRAPPERS: dict[str, int] = {
    "google.protobuf.DoubleValue": F.TYPE_DOUBLE,
    "google.protobuf.FloatValue": F.TYPE_FLOAT,
    "google.protobuf.Int64Value": F.TYPE_INT64,
    "google.protobuf.UInt64Value": F.TYPE_UINT64,
    "google.protobuf.Int32Value": F.TYPE_INT32,
    "google.protobuf.UInt32Value": F.TYPE_UINT32,
    "google.protobuf.BoolValue": F.TYPE_BOOL,
    "google.protobuf.StringValue": F.TYPE_STRING,
    "google.protobuf.BytesValue": F.TYPE_BYTES,
}


def is_map(field: FieldDescriptor) -> bool:
    """Whether ``field`` is a map field."""
    return (
        field.is_repeated
        and field.message_type is not None
        and field.message_type.GetOptions().map_entry
    )


def is_optional(field: FieldDescriptor) -> bool:
    """Whether a singular field's column is optional (the field has presence)."""
    return not field.is_repeated and field.has_presence


def message_kind(desc: Descriptor) -> str:
    """How a message-typed value maps: ``timestamp``, ``duration``, ``wrapper``, ``empty``
    (no fields: boolean) or ``struct``."""
    if desc.full_name == TIMESTAMP:
        return "timestamp"
    if desc.full_name == DURATION:
        return "duration"
    if desc.full_name in WRAPPERS:
        return "wrapper"
    if not desc.fields:
        return "empty"
    return "struct"


def iceberg_type(desc: Descriptor) -> StructType:
    """The Iceberg type of a whole message of ``desc``. Raises :class:`SchemaNotExpressible`."""
    return _Converter().struct(desc, ())


class _Converter:
    def __init__(self) -> None:
        self.ids = itertools.count(1)

    def struct(self, desc: Descriptor, chain: tuple[str, ...]) -> StructType:
        """A message's struct, its fields' ids first (pre-order), then their types."""
        if desc.full_name in chain:
            raise SchemaNotExpressible(f"recursive message {desc.full_name}")
        chain = (*chain, desc.full_name)
        ids = [next(self.ids) for _ in desc.fields]
        fields = []
        for field_id, field in zip(ids, desc.fields, strict=True):
            type_ = self.field_type(field, chain)
            fields.append(NestedField(field_id, field.name, type_, required=not is_optional(field)))
        return StructType(*fields)

    def field_type(self, field: FieldDescriptor, chain: tuple[str, ...]) -> IcebergType:
        """The type of a field's whole value (a list or map for repeated ones)."""
        if is_map(field):
            entry = field.message_type
            key_id, value_id = next(self.ids), next(self.ids)
            key = self.value_type(entry.fields_by_name["key"], chain)
            value = self.value_type(entry.fields_by_name["value"], chain)
            return MapType(key_id, key, value_id, value, value_required=True)
        if field.is_repeated:
            element_id = next(self.ids)
            return ListType(element_id, self.value_type(field, chain), element_required=True)
        return self.value_type(field, chain)

    def value_type(self, field: FieldDescriptor, chain: tuple[str, ...]) -> IcebergType:
        """The type of one value of a field (an element of a repeated one)."""
        if field.type == F.TYPE_ENUM:
            return StringType()
        if field.type in SCALAR_TYPES:
            return SCALAR_TYPES[field.type]
        desc = field.message_type
        kind = message_kind(desc)
        if kind == "timestamp":
            return TimestamptzType()
        if kind == "duration":
            return LongType()
        if kind == "wrapper":
            return SCALAR_TYPES[WRAPPERS[desc.full_name]]
        if kind == "empty":
            return BooleanType()
        return self.struct(desc, chain)
