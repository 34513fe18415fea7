"""Iceberg schema evolution by field path: fold a new value type into a table's columns.

A path that exists keeps its field id; a new path gets the next id (``last_column_id + 1``, then
its nested fields in the order Iceberg assigns fresh ids: a struct's fields first, then their
types). Allowed changes are the ones Iceberg can express without rewriting data: new fields
(always optional), int → long, float → double, decimal(P, S) → decimal(P', S) with P' >= P,
required → optional. Anything else raises :class:`NotExpressible`, and the caller keeps the
records of that schema raw instead of reinterpreting them.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyiceberg.types import (
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    PrimitiveType,
    StructType,
)

__all__ = ["IdAllocator", "NotExpressible", "fits", "fresh_ids", "merge_type"]


class NotExpressible(ValueError):
    """A type change Iceberg cannot express (the message names the path and both types)."""


@dataclass
class IdAllocator:
    """Hands out field ids after ``last_column_id``."""

    last_column_id: int

    def next(self) -> int:
        """The next unused field id."""
        self.last_column_id += 1
        return self.last_column_id


def fresh_ids(type_: IcebergType, ids: IdAllocator) -> IcebergType:
    """``type_`` with every nested field id replaced by a new one (a struct's fields first, then
    each field's own nested type); every field made optional except list elements and map
    values that are required in ``type_`` (they come from non-nullable source types)."""
    if isinstance(type_, StructType):
        numbered = [(field, ids.next()) for field in type_.fields]
        return StructType(
            *(
                NestedField(field_id, field.name, fresh_ids(field.field_type, ids), required=False)
                for field, field_id in numbered
            )
        )
    if isinstance(type_, ListType):
        element_id = ids.next()
        return ListType(
            element_id, fresh_ids(type_.element_type, ids), element_required=type_.element_required
        )
    if isinstance(type_, MapType):
        key_id, value_id = ids.next(), ids.next()
        return MapType(
            key_id,
            fresh_ids(type_.key_type, ids),
            value_id,
            fresh_ids(type_.value_type, ids),
            value_required=type_.value_required,
        )
    return type_


def _promoted(old: PrimitiveType, new: PrimitiveType, path: str) -> PrimitiveType:
    if old == new:
        return old
    pairs = {(IntegerType(), LongType()), (FloatType(), DoubleType())}
    if (old, new) in pairs:
        return new
    if (new, old) in pairs:
        return old  # the table is already wider: the new writer's values fit
    if isinstance(old, DecimalType) and isinstance(new, DecimalType) and old.scale == new.scale:
        return old if old.precision >= new.precision else new
    raise NotExpressible(f"{path}: {old} cannot become {new} in Iceberg")


def merge_type(
    old: IcebergType, new: IcebergType, ids: IdAllocator, path: str, *, add: bool = True
) -> IcebergType:
    """The table type that holds both ``old`` (the table's, ids kept) and ``new`` (placeholder
    ids): new struct fields added (with ids from ``ids``), promotions applied. With ``add``
    false a new field raises :class:`NotExpressible` instead (a schema that must fit as is)."""
    if isinstance(old, StructType) and isinstance(new, StructType):
        return _merge_struct(old, new, ids, path, add=add)
    if isinstance(old, ListType) and isinstance(new, ListType):
        element = merge_type(old.element_type, new.element_type, ids, f"{path}[]", add=add)
        required = old.element_required and new.element_required
        if required != old.element_required and not add:
            raise NotExpressible(f"{path}: list elements would become optional")
        return ListType(old.element_id, element, element_required=required)
    if isinstance(old, MapType) and isinstance(new, MapType):
        key = merge_type(old.key_type, new.key_type, ids, f"{path}.key", add=add)
        value = merge_type(old.value_type, new.value_type, ids, f"{path}.value", add=add)
        required = old.value_required and new.value_required
        if required != old.value_required and not add:
            raise NotExpressible(f"{path}: map values would become optional")
        return MapType(old.key_id, key, old.value_id, value, value_required=required)
    if isinstance(old, PrimitiveType) and isinstance(new, PrimitiveType):
        merged = _promoted(old, new, path)
        if merged != old and not add:
            raise NotExpressible(f"{path}: the table's {old} would have to become {new}")
        return merged
    raise NotExpressible(f"{path}: {old} cannot become {new} in Iceberg")


def _merge_struct(
    old: StructType, new: StructType, ids: IdAllocator, path: str, *, add: bool
) -> StructType:
    fields = list(old.fields)
    position = {field.name: index for index, field in enumerate(fields)}
    for field in new.fields:
        child = f"{path}.{field.name}" if path else field.name
        if field.name in position:
            index = position[field.name]
            current = fields[index]
            merged = merge_type(current.field_type, field.field_type, ids, child, add=add)
            fields[index] = NestedField(
                current.field_id, current.name, merged, required=current.required
            )
        elif not add:
            raise NotExpressible(f"{child}: the table has no such column")
        else:
            field_id = ids.next()
            fields.append(
                NestedField(field_id, field.name, fresh_ids(field.field_type, ids), required=False)
            )
            position[field.name] = len(fields) - 1
    return StructType(*fields)


def fits(table: StructType, new: StructType) -> bool:
    """Whether values of ``new`` read into ``table`` without changing the table."""
    try:
        merge_type(table, new, IdAllocator(1 << 30), "", add=False)
    except NotExpressible:
        return False
    return True
