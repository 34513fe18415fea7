"""Typed rows as Spark's Arrow reader takes them back from ``mapInArrow``.

The typed layout's Arrow types are PyIceberg's (large strings, binaries and lists, ``arrow.uuid``,
``fixed_size_binary``); Spark 4.0 reads large strings and binaries but refuses large lists and
fixed-size binaries, and shows an Iceberg ``uuid`` column as a string (its 36-character text,
which Iceberg's Spark writer turns back into the 16 bytes). So lists become 32-bit lists, fixed
becomes binary, uuids their text; everything else passes as it is. Nothing here imports pyspark:
these functions run in Spark's Python workers.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = ["spark_arrow_type", "to_spark_array", "uuid_text"]

_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
# Where the 32 hex digits go in the 36 characters of 8-4-4-4-12.
_DIGITS = np.array([i for i in range(36) if i not in (8, 13, 18, 23)])


def _is_uuid(type_: pa.DataType) -> bool:
    return isinstance(type_, pa.BaseExtensionType) and type_.extension_name == "arrow.uuid"


def spark_arrow_type(type_: pa.DataType) -> pa.DataType:
    """The Arrow type Spark accepts for values of ``type_`` (field metadata dropped)."""
    if _is_uuid(type_):
        return pa.string()
    if pa.types.is_fixed_size_binary(type_):
        return pa.binary()
    if pa.types.is_large_list(type_) or pa.types.is_list(type_):
        element = type_.value_field
        return pa.list_(pa.field(element.name, spark_arrow_type(element.type), element.nullable))
    if pa.types.is_map(type_):
        return pa.map_(
            pa.field("key", spark_arrow_type(type_.key_type), False),
            pa.field("value", spark_arrow_type(type_.item_type), type_.item_field.nullable),
        )
    if pa.types.is_struct(type_):
        return pa.struct([pa.field(f.name, spark_arrow_type(f.type), f.nullable) for f in type_])
    return type_


def _has_uuid(type_: pa.DataType) -> bool:
    if _is_uuid(type_):
        return True
    if pa.types.is_large_list(type_) or pa.types.is_list(type_):
        return _has_uuid(type_.value_type)
    if pa.types.is_map(type_):
        return _has_uuid(type_.key_type) or _has_uuid(type_.item_type)
    if pa.types.is_struct(type_):
        return any(_has_uuid(f.type) for f in type_)
    return False


def uuid_text(array: pa.Array) -> pa.Array:
    """The canonical text (``8-4-4-4-12``, lower case) of 16-byte uuids, nulls kept."""
    if isinstance(array, pa.ExtensionArray):
        array = array.storage
    count = len(array)
    data = array.buffers()[1]
    raw = (
        np.frombuffer(data, dtype=np.uint8)[array.offset * 16 : (array.offset + count) * 16]
        if data is not None
        else np.zeros(count * 16, np.uint8)
    ).reshape(count, 16)
    digits = np.empty((count, 32), dtype=np.uint8)
    digits[:, 0::2] = _HEX[raw >> 4]
    digits[:, 1::2] = _HEX[raw & 15]
    text = np.full((count, 36), ord("-"), dtype=np.uint8)
    text[:, _DIGITS] = digits
    offsets = np.arange(0, 36 * (count + 1), 36, dtype=np.int32)
    validity = None
    if array.null_count:
        validity = pa.array(np.asarray(array.is_valid(), dtype=bool)).buffers()[1]
    return pa.Array.from_buffers(
        pa.string(),
        count,
        [validity, pa.py_buffer(offsets), pa.py_buffer(text.tobytes())],
        null_count=array.null_count,
    )


def _mask(array: pa.Array) -> pa.Array | None:
    return array.is_null() if array.null_count else None


def to_spark_array(array: pa.Array | pa.ChunkedArray) -> pa.Array:
    """``array`` as values of :func:`spark_arrow_type` of its type."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks() if array.num_chunks != 1 else array.chunk(0)
    type_ = array.type
    target = spark_arrow_type(type_)
    if not _has_uuid(type_):
        return array if type_.equals(target) else array.cast(target)
    if _is_uuid(type_):
        return uuid_text(array)
    if pa.types.is_struct(type_):
        children = [to_spark_array(array.field(i)) for i in range(type_.num_fields)]
        return pa.StructArray.from_arrays(children, fields=list(target), mask=_mask(array))
    if pa.types.is_map(type_):
        return pa.MapArray.from_arrays(
            array.offsets,
            to_spark_array(array.keys),
            to_spark_array(array.items),
            type=target,
            mask=_mask(array),
        )
    # a (large) list of uuids, or of something holding them
    offsets = array.offsets
    start, stop = offsets[0].as_py(), offsets[-1].as_py()
    values = to_spark_array(array.values.slice(start, stop - start))
    relative = np.asarray(offsets, dtype=np.int64) - start
    return pa.ListArray.from_arrays(
        pa.array(relative.astype(np.int32)), values, type=target, mask=_mask(array)
    )
