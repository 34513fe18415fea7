"""Vectorized Protobuf encoding: an Arrow array of decoded values (the type
:func:`.types.iceberg_type` gives) back to the payloads the codec's ``encode`` has always
produced: the message-index list ``00`` then upb's deterministic serialization of the message
the codec builds from the value.

A message descriptor is compiled into a program (:class:`ProtoEncodeProgram`) for the kernel of
:mod:`.encode_kernel`, with the tree of columns (:class:`Column`) the value array is
flattened into. The program writes what upb writes: fields in number order; proto3 fields
without presence only when not their default (a float or double by its bits, so ``-0.0`` is
written); fields with presence whenever set, default or not; an empty message (a boolean) only
when true, except as an element or a map value; repeated scalars packed when the field is (proto3
by default), one record per element otherwise; groups between their start and end tags; a map
entry with both its key and its value; negative int32 and enum values in 10 bytes; Timestamp and
Duration as seconds and nanoseconds, each written when not zero; a wrapper as a message whose
value is written when not its default.

Rows the kernel leaves to upb (see :mod:`.encode_kernel`; maps of two or more entries
mostly) are encoded by the caller's upb function and put back in their places. A batch the
kernel cannot take at all (a null where the type has none, values that do not cast to the
decoded type) goes to upb whole; a schema it does not handle has no program.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from bergstream.core.api import project_array
from bergstream.plugins.value_codecs.protobuf import encode_kernel as k
from bergstream.plugins.value_codecs.protobuf.types import (
    WRAPPERS,
    is_map,
    is_optional,
    message_kind,
)
from bergstream.plugins.value_codecs.shared.flatten import bits, pack, strings, window

__all__ = [
    "Column",
    "ProtoEncodeProgram",
    "ProtoEncoder",
    "compile_encoder",
    "encode_upb",
    "encoder_for",
]

F = FieldDescriptor
A64, A32, A8 = 0, 1, 2
_VARINT, _I64, _LEN, _START, _END, _I32 = 0, 1, 2, 3, 4, 5

#: field type -> (conversion, wire type, column kind)
_SCALARS: dict[int, tuple[int, int, str]] = {
    F.TYPE_INT32: (k.C_INT32, _VARINT, "int32"),
    F.TYPE_SINT32: (k.C_SINT32, _VARINT, "int32"),
    F.TYPE_SFIXED32: (k.C_SFIXED32, _I32, "int32"),
    F.TYPE_INT64: (k.C_INT64, _VARINT, "int64"),
    F.TYPE_SINT64: (k.C_SINT64, _VARINT, "int64"),
    F.TYPE_SFIXED64: (k.C_SFIXED64, _I64, "int64"),
    F.TYPE_UINT32: (k.C_UINT32, _VARINT, "int64"),
    F.TYPE_FIXED32: (k.C_FIXED32, _I32, "int64"),
    F.TYPE_UINT64: (k.C_UINT64, _VARINT, "decimal"),
    F.TYPE_FIXED64: (k.C_FIXED64, _I64, "decimal"),
    F.TYPE_FLOAT: (k.C_FLOAT, _I32, "float32"),
    F.TYPE_DOUBLE: (k.C_DOUBLE, _I64, "float64"),
    F.TYPE_BOOL: (k.C_BOOL, _VARINT, "bool"),
    F.TYPE_STRING: (k.C_STRING, _LEN, "string"),
    F.TYPE_BYTES: (k.C_BYTES, _LEN, "binary"),
    F.TYPE_ENUM: (k.C_ENUM, _VARINT, "string"),
}
#: column kind -> (arena, numpy type of the Arrow values buffer)
_KINDS: dict[str, tuple[int, type]] = {
    "int32": (A32, np.int32),
    "float32": (A32, np.int32),
    "int64": (A64, np.int64),
    "float64": (A64, np.int64),
    "decimal": (A64, np.int64),
}


@dataclass(eq=False)
class Column:
    """One Arrow array of the value and the columns it is flattened into.

    ``kind``: struct, list, map, string, binary, bool, int32, int64, float32, float64 or
    decimal (two int64 words per value). ``valid`` is the validity column (-1: the type has no
    nulls there), ``col`` the values column (the offsets of string, binary, list and map),
    ``data`` the bytes of string and binary."""

    kind: str
    valid: int = -1
    col: int = -1
    data: int = -1
    children: list[Column] = field(default_factory=list)


@dataclass(eq=False)
class ProtoEncodeProgram:
    """A compiled message: instructions, oneof pairs, enum tables, the column tree."""

    code: np.ndarray  # (n, 8) int64
    aux: np.ndarray  # (m, 2) int64
    etab: np.ndarray  # int64, per enum: count, closed, then (number, name start, name end)
    name_data: np.ndarray  # uint8
    col_arena: list[int]
    root: Column
    depth: int  # stack entries a row can need


class _NotHandled(Exception):
    """A shape the kernel does not handle."""


def compile_encoder(desc: Descriptor) -> ProtoEncodeProgram | None:
    """The program of a whole message of ``desc`` (expressible: :func:`.types.
    iceberg_type` accepted it), or None when the kernel does not handle its shape."""
    try:
        return _Compiler().compile(desc)
    except _NotHandled:
        return None


def _tag(number: int, wire: int) -> int:
    return (number << 3) | wire


class _Compiler:
    def __init__(self) -> None:
        self.arena: list[int] = []
        self.code: list[list[int]] = []
        self.aux: list[tuple[int, int]] = []
        self.enums: dict[str, int] = {}
        self.etab: list[int] = []
        self.name_data = bytearray()
        self.depth = 0

    def compile(self, desc: Descriptor) -> ProtoEncodeProgram:
        root = self.struct_column(desc, nullable=False)
        self.message_fields(desc, root, 0)
        self.emit(k.OP_END)
        return ProtoEncodeProgram(
            code=np.array(self.code, dtype=np.int64).reshape(-1, 8),
            aux=np.array(self.aux or [(0, 0)], dtype=np.int64).reshape(-1, 2),
            etab=np.array(self.etab or [0], dtype=np.int64),
            name_data=np.frombuffer(bytes(self.name_data) or b"\0", dtype=np.uint8),
            col_arena=self.arena,
            root=root,
            depth=self.depth + 1,
        )

    # -- columns ----------------------------------------------------------------------------

    def column(self, arena: int) -> int:
        self.arena.append(arena)
        return len(self.arena) - 1

    def struct_column(self, desc: Descriptor, nullable: bool) -> Column:
        column = Column("struct", self.column(A8) if nullable else -1)
        column.children = [self.field_column(f) for f in desc.fields]
        return column

    def field_column(self, field: FieldDescriptor) -> Column:
        if is_map(field):
            entry = field.message_type
            key = self.value_column(entry.fields_by_name["key"], False)
            value = self.value_column(entry.fields_by_name["value"], False)
            return Column("map", -1, self.column(A64), children=[key, value])
        if field.is_repeated:
            element = self.value_column(field, False)
            return Column("list", -1, self.column(A64), children=[element])
        return self.value_column(field, is_optional(field))

    def value_column(self, field: FieldDescriptor, nullable: bool) -> Column:
        desc = field.message_type
        kind = "scalar" if desc is None else message_kind(desc)
        if kind == "struct":
            return self.struct_column(desc, nullable)
        valid = self.column(A8) if nullable else -1
        if kind == "scalar":
            return self.scalar_column(field.type, valid)
        if kind in ("timestamp", "duration"):
            return Column("int64", valid, self.column(A64))
        if kind == "wrapper":
            return self.scalar_column(WRAPPERS[desc.full_name], valid)
        return Column("bool", valid, self.column(A8))  # empty

    def scalar_column(self, field_type: int, valid: int) -> Column:
        if field_type not in _SCALARS:
            raise _NotHandled
        kind = _SCALARS[field_type][2]
        if kind in ("string", "binary"):
            return Column(kind, valid, self.column(A64), self.column(A8))
        if kind == "bool":
            return Column(kind, valid, self.column(A8))
        return Column(kind, valid, self.column(_KINDS[kind][0]))

    # -- code -------------------------------------------------------------------------------

    def emit(self, op: int, *operands: int) -> int:
        self.code.append([op, *operands, *([0] * (7 - len(operands)))])
        return len(self.code) - 1

    def message_fields(self, desc: Descriptor, column: Column, depth: int) -> None:
        """Code of a message's fields, in number order (as upb writes them)."""
        self.depth = max(self.depth, depth)
        by_field = dict(zip(desc.fields, column.children, strict=True))
        for oneof in desc.oneofs:
            if len(oneof.fields) > 1:
                first = len(self.aux)
                for member in oneof.fields:
                    child = by_field[member]
                    empty = member.message_type is not None and child.kind == "bool"
                    empty = empty and message_kind(member.message_type) == "empty"
                    self.aux.append((child.valid, child.col if empty else -1))
                self.emit(k.OP_ONEOF, first, len(oneof.fields))
        for f in sorted(desc.fields, key=lambda f: f.number):
            self.field(f, by_field[f], depth)

    def field(self, field: FieldDescriptor, column: Column, depth: int) -> None:
        number = field.number
        if is_map(field):
            entry = field.message_type
            loop = self.emit(k.OP_LOOP, column.col, -1, 1)
            body = len(self.code)
            self.emit(k.OP_MSG, _tag(number, _LEN), -1, -1, 0)
            key_column, value_column = column.children
            self.value(entry.fields_by_name["key"], key_column, "always", 1, depth + 2)
            self.value(entry.fields_by_name["value"], value_column, "always", 2, depth + 2)
            self.emit(k.OP_CLOSE, 0)
            self.emit(k.OP_NEXT, body, 0)
            self.code[loop][2] = len(self.code)
            return
        if field.is_repeated:
            element = column.children[0]
            self.depth = max(self.depth, depth + 1)
            if field.message_type is None and field.is_packed:
                loop = self.emit(k.OP_PACKED, column.col, -1, 0, _tag(number, _LEN))
                body = len(self.code)
                conv = _SCALARS[field.type][0]
                self.emit(k.OP_SCALAR, -1, conv, element.col, element.data, -1, 0,
                          self.enum(field))  # fmt: skip
                self.emit(k.OP_NEXT, body, 1)
            else:
                loop = self.emit(k.OP_LOOP, column.col, -1, 0)
                body = len(self.code)
                self.value(field, element, "always", number, depth + 1)
                self.emit(k.OP_NEXT, body, 0)
            self.code[loop][2] = len(self.code)
            return
        mode = "presence" if is_optional(field) else "implicit"
        self.value(field, column, mode, number, depth)

    def value(
        self, field: FieldDescriptor, column: Column, mode: str, number: int, depth: int
    ) -> None:
        """Code writing one value of ``field`` as field ``number``: ``mode`` implicit (not
        when default), presence (when valid) or always."""
        self.depth = max(self.depth, depth)
        valid = column.valid if mode == "presence" else -1
        desc = field.message_type
        if desc is None:
            conv, wire, _ = _SCALARS[field.type]
            self.emit(k.OP_SCALAR, _tag(number, wire), conv, column.col, column.data, valid,
                      int(mode == "implicit"), self.enum(field))  # fmt: skip
            return
        kind = message_kind(desc)
        group = field.type == F.TYPE_GROUP
        if group and kind not in ("struct", "empty"):
            raise _NotHandled
        start = _tag(number, _START if group else _LEN)
        end = _tag(number, _END) if group else 0
        if kind in ("timestamp", "duration"):
            self.emit(k.OP_TIME, start, column.col, valid, int(kind == "duration"))
        elif kind == "empty":
            self.emit(k.OP_EMPTY, start, column.col, valid, end, int(mode == "always"))
        elif kind == "wrapper":
            at = self.emit(k.OP_MSG, start, valid, -1, end)
            inner = desc.fields_by_name["value"]
            conv, wire, _ = _SCALARS[inner.type]
            self.emit(k.OP_SCALAR, _tag(1, wire), conv, column.col, column.data, -1, 1, -1)
            self.emit(k.OP_CLOSE, end)
            self.code[at][3] = len(self.code)
        else:
            at = self.emit(k.OP_MSG, start, valid, -1, end)
            self.message_fields(desc, column, depth + 1)
            self.emit(k.OP_CLOSE, end)
            self.code[at][3] = len(self.code)

    def enum(self, field: FieldDescriptor) -> int:
        """Where ``field``'s enum table (every name, with its number) starts in ``etab``; -1 if
        the field is no enum."""
        if field.type != F.TYPE_ENUM:
            return -1
        enum = field.enum_type
        known = self.enums.get(enum.full_name)
        if known is not None:
            return known
        at = len(self.etab)
        self.etab += [len(enum.values), int(enum.is_closed)]
        for value in enum.values:
            start = len(self.name_data)
            self.name_data += value.name.encode()
            self.etab += [value.number, start, len(self.name_data)]
        self.enums[enum.full_name] = at
        return at


# ---------------------------------------------------------------- flattening


class _Refused(Exception):
    """A batch the kernel does not take (a null where the type has none)."""


def _flatten(
    column: Column, array: pa.Array, columns: list[np.ndarray | None], live: np.ndarray | None
) -> None:
    """Fill ``columns`` with ``array`` (a value array of ``column``); ``live`` marks the entries
    the encoder visits (None: all). Raises :class:`_Refused` for a visited null the type
    cannot hold."""
    length = len(array)
    valid = None
    if array.null_count:
        valid = bits(array.buffers()[0], array.offset, length)
        if column.valid < 0:
            dead = valid == 0
            if live is not None:
                dead &= live
            if dead.any():
                raise _Refused
            valid = None
        else:
            live = valid != 0 if live is None else live & (valid != 0)
    if column.valid >= 0:
        columns[column.valid] = valid if valid is not None else np.ones(length, dtype=np.uint8)
    kind = column.kind
    if kind == "struct":
        for i, child in enumerate(column.children):
            _flatten(child, array.field(i), columns, live)
    elif kind in ("list", "map"):
        offsets = np.asarray(array.offsets, dtype=np.int64)
        start, stop = int(offsets[0]), int(offsets[-1])
        child = array.values.slice(start, stop - start)
        columns[column.col] = offsets - start
        if live is not None:
            live = np.repeat(live, np.diff(offsets))
        if kind == "list":
            _flatten(column.children[0], child, columns, live)
        else:
            _flatten(column.children[0], child.field(0), columns, live)
            _flatten(column.children[1], child.field(1), columns, live)
    elif kind in ("string", "binary"):
        columns[column.col], columns[column.data] = strings(array)
    elif kind == "bool":
        columns[column.col] = bits(array.buffers()[1], array.offset, length)
    else:
        per_value = 2 if kind == "decimal" else 1
        columns[column.col] = window(array.buffers()[1], _KINDS[kind][1],
                                      array.offset * per_value, length * per_value)  # fmt: skip


def _pooled(count: int, dtype: type) -> np.ndarray:
    """An uninitialized array from Arrow's memory pool, which keeps freed pages for reuse: a
    batch's arenas and output then cost no fresh page faults (a third of the encoding time
    with numpy's allocations, measured)."""
    size = count * np.dtype(dtype).itemsize
    return np.frombuffer(pa.allocate_buffer(max(size, 1)), dtype=dtype, count=count)


# ---------------------------------------------------------------- the encoder

Upb = Callable[[pa.Array], pa.Array]


class ProtoEncoder:
    """Encodes Arrow values of ``arrow_type`` with one compiled message."""

    def __init__(self, program: ProtoEncodeProgram, arrow_type: pa.DataType) -> None:
        self.program = program
        self.arrow_type = arrow_type

    def encode(self, values: pa.Array, upb: Upb) -> pa.Array:
        """One payload per row of ``values`` (a struct array, no null rows): the kernel's, and
        ``upb``'s (a function encoding an array of rows the old way) for the rows and batches
        the kernel leaves to it."""
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        try:
            if values.type != self.arrow_type:
                values = _conformed(values, self.arrow_type)
            payloads, slow = self._encode(values)
        except (_Refused, pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            return upb(values)
        if not slow.any():
            return payloads
        slow_rows = np.flatnonzero(slow)
        rows = len(payloads)
        if len(slow_rows) == rows:
            return upb(values)
        other = upb(values.take(pa.array(slow_rows)))
        # Row i of the result: the kernel's row i, or (for the j-th slow row) upb's row j.
        where = np.arange(rows, dtype=np.int64)
        where[slow_rows] = rows + np.arange(len(slow_rows), dtype=np.int64)
        return pa.concat_arrays([payloads, other]).take(pa.array(where))

    def _encode(self, values: pa.Array) -> tuple[pa.Array, np.ndarray]:
        """The kernel's payloads (empty for slow rows) and which rows are slow."""
        program = self.program
        rows = len(values)
        columns: list[np.ndarray | None] = [None] * len(program.col_arena)
        _flatten(program.root, values, columns, None)
        arenas, base = pack(program.col_arena, columns, _pooled)
        out = _pooled(max(64, sum(a.nbytes for a in arenas) + 8 * rows), np.uint8)
        offsets = _pooled(rows + 1, np.int64)
        slow = np.zeros(rows, dtype=np.uint8)
        stack = np.zeros((program.depth + 1, 3), dtype=np.int64)
        out = k.encode_rows(
            rows, program.code, program.aux, program.etab, program.name_data, *arenas, base,
            stack, out, offsets, slow,
        )  # fmt: skip
        size = int(offsets[rows])
        buffers = [None, pa.py_buffer(offsets), pa.py_buffer(out[:size])]
        return pa.Array.from_buffers(pa.large_binary(), rows, buffers), slow.view(bool)


_ENCODERS: weakref.WeakKeyDictionary[type, ProtoEncoder | None] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def encoder_for(
    message_class: type, descriptor: Descriptor, arrow_type: pa.DataType
) -> ProtoEncoder | None:
    """The encoder of ``descriptor``'s messages (cached per message class, which the codec's
    compiled schema holds), or None when the kernel does not handle the message."""
    with _LOCK:
        if message_class in _ENCODERS:
            return _ENCODERS[message_class]
    program = compile_encoder(descriptor)
    encoder = ProtoEncoder(program, arrow_type) if program is not None else None
    with _LOCK:
        _ENCODERS[message_class] = encoder
    return encoder


def encode_upb(
    message_class: type[Message], fill: Callable[[Message, Any], None], plain: pa.DataType,
    values: pa.Array,
) -> pa.Array:  # fmt: skip
    """The payloads of ``values`` built with upb, one message per row: ``fill`` sets a message
    from a row of ``values`` cast to ``plain`` (timestamps as int64), serialized
    deterministically after the index list ``00``."""
    out = []
    for row in _conformed(values, plain).to_pylist():
        message = message_class()
        fill(message, row)
        out.append(b"\x00" + message.SerializePartialToString(deterministic=True))
    return pa.array(out, pa.large_binary())


def _conformed(values: pa.Array, type_: pa.DataType) -> pa.Array:
    """``values`` cast to ``type_``. Arrow's cast refuses nulls in a required child even under
    a null parent (what a Parquet reader gives for an absent message): rebuilt level by level
    they are fine, and a null a required field holds under a present parent is still
    refused."""
    try:
        return values.cast(type_)
    except pa.ArrowInvalid:
        rebuilt = project_array(values, type_)
        _check_required(rebuilt)
        return rebuilt


def _check_required(array: pa.Array, present: pa.Array | None = None) -> None:
    """Raise ``ArrowInvalid`` where a required (non-nullable) field of ``array`` is null under
    a parent that is present (``present``: where the parent is; None: every row)."""
    if isinstance(array.type, pa.ExtensionType) or not pa.types.is_struct(array.type):
        return
    valid = array.is_valid() if present is None else pa.compute.and_(present, array.is_valid())
    for index, struct_field in enumerate(array.type):
        child = array.field(index)
        if (
            not struct_field.nullable
            and pa.compute.any(pa.compute.and_(valid, child.is_null())).as_py()
        ):
            raise pa.ArrowInvalid(f"required field {struct_field.name} holds a null")
        _check_required(child, valid)
