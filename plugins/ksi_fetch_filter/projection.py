"""Rows of a data file projected onto a table's current Arrow schema by Parquet field id, as
Iceberg resolves columns: a file written before the schema evolved lacks the fields added since
(they read null, at any depth), has narrower types (int before long, float before double, a
decimal of lower precision: cast up), and may use other Arrow layouts of the same types (a file
Spark wrote reads as ``binary``/``string``/``list`` where PyIceberg uses the large ones)."""

from __future__ import annotations

import pyarrow as pa

_FIELD_ID = b"PARQUET:field_id"


def field_id(field: pa.Field) -> int | None:
    """The Iceberg field id an Arrow field carries in its Parquet metadata, if any."""
    if field.metadata is None or _FIELD_ID not in field.metadata:
        return None
    return int(field.metadata[_FIELD_ID])


def _match(target: pa.Field, fields: list[pa.Field]) -> int | None:
    """Index of the field of ``fields`` that is ``target``: by field id, or by name when
    either side carries no field ids (a file some other writer made)."""
    wanted = field_id(target)
    if wanted is not None and any(field_id(field) is not None for field in fields):
        for index, field in enumerate(fields):
            if field_id(field) == wanted:
                return index
        return None
    for index, field in enumerate(fields):
        if field.name == target.name:
            return index
    return None


def _nulls(type_: pa.DataType, length: int) -> pa.Array:
    return pa.nulls(length, type_)


def _validity(array: pa.Array) -> pa.Array | None:
    return array.is_null() if array.null_count else None


def _struct(array: pa.StructArray, target: pa.StructType) -> pa.Array:
    source = [array.type.field(i) for i in range(array.type.num_fields)]
    children = []
    for index in range(target.num_fields):
        wanted = target.field(index)
        found = _match(wanted, source)
        if found is None:
            children.append(_nulls(wanted.type, len(array)))
        else:
            # ``field()`` (sliced like the parent), not ``flatten()``: that would null out the
            # children under null parents, which a required child cannot hold.
            children.append(conform_array(array.field(found), wanted.type))
    fields = [target.field(i) for i in range(target.num_fields)]
    return pa.StructArray.from_arrays(children, fields=fields, mask=_validity(array))


def _list(array: pa.Array, target: pa.DataType) -> pa.Array:
    offsets = array.offsets
    values = conform_array(array.values, target.value_type)
    if pa.types.is_large_list(target):
        offsets = offsets.cast(pa.int64())
        return pa.LargeListArray.from_arrays(offsets, values, type=target, mask=_validity(array))
    return pa.ListArray.from_arrays(
        offsets.cast(pa.int32()), values, type=target, mask=_validity(array)
    )


def _map(array: pa.MapArray, target: pa.MapType) -> pa.Array:
    keys = conform_array(array.keys, target.key_type)
    items = conform_array(array.items, target.item_type)
    return pa.MapArray.from_arrays(array.offsets, keys, items, type=target, mask=_validity(array))


def conform_array(array: pa.Array | pa.ChunkedArray, target: pa.DataType) -> pa.Array:
    """``array`` as ``target``: nested fields matched by field id (missing ones null), primitive
    types cast (promotions, large layouts), extension types built on their storage."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks() if array.num_chunks != 1 else array.chunk(0)
    if array.type == target:
        return array
    if isinstance(target, pa.ExtensionType):
        if isinstance(array.type, pa.ExtensionType):
            array = array.storage
        return pa.ExtensionArray.from_storage(target, conform_array(array, target.storage_type))
    if pa.types.is_struct(target) and pa.types.is_struct(array.type):
        return _struct(array, target)
    if (pa.types.is_list(target) or pa.types.is_large_list(target)) and (
        pa.types.is_list(array.type) or pa.types.is_large_list(array.type)
    ):
        return _list(array, target)
    if pa.types.is_map(target) and pa.types.is_map(array.type):
        return _map(array, target)
    return array.cast(target)


def conform(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """``rows`` (a data file's columns, field ids in their metadata) as a table of ``schema``:
    every field of ``schema`` present, in its order and types; file columns it lacks dropped."""
    source = list(rows.schema)
    columns = []
    for target in schema:
        found = _match(target, source)
        if found is None:
            columns.append(_nulls(target.type, rows.num_rows))
        else:
            columns.append(conform_array(rows.column(found), target.type))
    return pa.Table.from_arrays(columns, schema=schema)
