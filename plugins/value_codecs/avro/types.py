"""The Iceberg type of an Avro schema (the design's "Avro -> Iceberg" rule).

record -> struct (fields in order, null-typed fields left out); enum -> string; array -> list;
map -> map<string, V>; fixed -> fixed[n]; bytes -> binary; string -> string; boolean, int, long,
float, double as is; ``[null, T]`` / ``[T, null]`` -> optional T; any other union -> a struct
with one optional field per non-null branch, named by the branch's type (``int``, ``string``,
a named type's short name), null branch = struct null. Logical types: decimal (bytes or fixed,
precision <= 38) -> decimal(p, s); date -> date; time-millis / time-micros -> long microseconds
since midnight (Spark cannot read Iceberg ``time``); timestamp-millis / -micros -> timestamptz;
local-timestamp-millis / -micros -> timestamp; uuid -> uuid.

Nullability is the schema's: a record field, list element or map value is required unless its
Avro type is a union with null (the table layout makes top-level columns optional). Field ids
are placeholders, unique within the type, assigned in pre-order.
"""

from __future__ import annotations

import itertools

from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
    UUIDType,
)

from bergstream.core.api import SchemaNotExpressible
from bergstream.plugins.value_codecs.avro.schema import AvroNode

__all__ = ["MAX_DECIMAL_PRECISION", "branch_names", "iceberg_type", "is_null", "union_parts"]

#: Iceberg's widest decimal.
MAX_DECIMAL_PRECISION = 38

_PRIMITIVE_TYPES: dict[str, IcebergType] = {
    "boolean": BooleanType(),
    "int": IntegerType(),
    "long": LongType(),
    "float": FloatType(),
    "double": DoubleType(),
    "bytes": BinaryType(),
    "string": StringType(),
}

_LOGICAL_TYPES: dict[str, IcebergType] = {
    "date": DateType(),
    "time-millis": LongType(),
    "time-micros": LongType(),
    "timestamp-millis": TimestamptzType(),
    "timestamp-micros": TimestamptzType(),
    "local-timestamp-millis": TimestampType(),
    "local-timestamp-micros": TimestampType(),
    "uuid": UUIDType(),
}


def is_null(node: AvroNode) -> bool:
    """Whether values of ``node`` are always null (type null, or a union of nulls only): such a
    record field has no column."""
    if node.kind == "union":
        return all(b.kind == "null" for b in node.branches)
    return node.kind == "null"


def union_parts(node: AvroNode) -> tuple[list[AvroNode], bool]:
    """The non-null branches of a union and whether it has a null branch."""
    others = [b for b in node.branches if b.kind != "null"]
    return others, len(others) < len(node.branches)


def branch_names(branches: list[AvroNode]) -> list[str]:
    """Field names of a general union's struct: the branch's type name, or a named type's short
    name (its full name with ``_`` for dots when two short names clash)."""
    names = [b.short_name for b in branches]
    if len(set(names)) < len(names):
        names = [b.name.replace(".", "_") if b.name else b.kind for b in branches]
    if len(set(names)) < len(names):
        raise SchemaNotExpressible(f"a union has two branches of the same type: {names}")
    return names


def iceberg_type(node: AvroNode) -> IcebergType:
    """The Iceberg type of a whole value of ``node``. Raises :class:`SchemaNotExpressible`."""
    if is_null(node):
        raise SchemaNotExpressible("the value's schema is null: no column can hold it")
    return _Converter().value_type(node, top=True)[0]


class _Converter:
    def __init__(self) -> None:
        self.ids = itertools.count(1)

    def value_type(self, node: AvroNode, top: bool = False) -> tuple[IcebergType, bool]:
        """The type of a value of ``node`` and whether it is required (not a union with null)."""
        if node.kind != "union":
            return self.plain_type(node, top), True
        branches, nullable = union_parts(node)
        if not branches:
            raise SchemaNotExpressible("a list or map of nulls has no Iceberg type")
        if len(branches) == 1:
            return self.plain_type(branches[0], top), not nullable
        names = branch_names(branches)
        ids = [next(self.ids) for _ in branches]
        fields = [
            NestedField(field_id, name, self.plain_type(branch), required=False)
            for field_id, name, branch in zip(ids, names, branches, strict=True)
        ]
        return StructType(*fields), not nullable

    def plain_type(self, node: AvroNode, top: bool = False) -> IcebergType:
        """The type of a node that is not a union."""
        if node.logical == "decimal":
            if node.precision > MAX_DECIMAL_PRECISION:
                raise SchemaNotExpressible(
                    f"decimal({node.precision}, {node.scale}) is wider than Iceberg's 38 digits"
                )
            return DecimalType(node.precision, node.scale)
        if node.logical is not None:
            return _LOGICAL_TYPES[node.logical]
        if node.kind in _PRIMITIVE_TYPES:
            return _PRIMITIVE_TYPES[node.kind]
        if node.kind == "enum":
            return StringType()
        if node.kind == "fixed":
            if node.size == 0:
                raise SchemaNotExpressible(f"fixed {node.name} has size 0")
            return FixedType(node.size)
        if node.kind == "array":
            element_id = next(self.ids)
            element, required = self.value_type(_items(node))
            return ListType(element_id, element, element_required=required)
        if node.kind == "map":
            key_id, value_id = next(self.ids), next(self.ids)
            value, required = self.value_type(_items(node))
            return MapType(key_id, StringType(), value_id, value, value_required=required)
        if node.kind == "record":
            return self.record_type(node, top)
        if node.kind == "null":
            raise SchemaNotExpressible("a list or map of nulls has no Iceberg type")
        raise SchemaNotExpressible(f"a {node.kind} value has no Iceberg type")

    def record_type(self, node: AvroNode, top: bool) -> StructType:
        """A record's struct: one field per field that is not always null."""
        kept = [(name, child) for name, child in node.fields if not is_null(child)]
        if not kept and not top:
            raise SchemaNotExpressible(f"record {node.name} has no field that is not null")
        ids = [next(self.ids) for _ in kept]
        fields = []
        for field_id, (name, child) in zip(ids, kept, strict=True):
            type_, required = self.value_type(child)
            fields.append(NestedField(field_id, name, type_, required=required))
        return StructType(*fields)


def _items(node: AvroNode) -> AvroNode:
    assert node.items is not None
    return node.items
