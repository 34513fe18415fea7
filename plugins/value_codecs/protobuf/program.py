"""A Protobuf message descriptor compiled into a flat program for the fast decoder kernel
(:mod:`.decode_kernel`), with the :class:`~..shared.slot.Slot` tree that says which columns
hold each Arrow array of the decoded value (:mod:`..shared.arena_columns` turns them into Arrow
arrays without copies).

The program reads the one encoding upb's deterministic serialization gives: fields in number
order, each expected at most once (repeated ones as one run, packed ones as one non-empty
chunk), proto3 implicit-presence fields only when not their default, fields with presence even
when default, map entries with both key and value written. Anything else (a tag out of place,
an unknown field, trailing bytes) stops the kernel on that row, which then goes through upb.

A message with a group, or one whose values the kernel does not handle, gets no program
(:func:`compile_program` returns None) and is decoded by upb entirely.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from bergstream.plugins.value_codecs.protobuf.types import (
    WRAPPERS,
    is_map,
    is_optional,
    message_kind,
)
from bergstream.plugins.value_codecs.shared.arena_layout import (
    A8,
    A32,
    A64,
    PAD_OFF,
    PAD_SYM,
    PAD_Z8,
    PAD_Z32,
    PAD_Z64,
)
from bergstream.plugins.value_codecs.shared.slot import Slot

__all__ = ["ProtoProgram", "compile_program"]

F = FieldDescriptor

# Opcodes: row = [op, a, b, c, d, e, f, g].
OP_END = 0  # the row's message is complete (pos must be its end)
OP_FIELD = 1  # a=tag, b=pc when absent, c=absent fails (1) or pads (0), d=first pad, e=pads,
#               f=1 to push a repeat counter
OP_VALID = 2  # a=validity col8: append 1
OP_VALUE = 3  # a=conv, b=col, c=data col, d=1 if implicit presence (default fails),
#               e=first enum symbol, f=enum symbol count
OP_PACKED = 4  # a=conv, b=list offsets col, c=value col, d=data col, e, f as OP_VALUE
OP_AGAIN = 5  # a=tag, b=pc of the element's body, c=list offsets col, d=1: no second entry
OP_BEGIN = 6  # a length-delimited message starts
OP_FINISH = 7  # the message must end here
OP_TIME = 8  # a=col64, b=1 for a Duration (0 Timestamp): the message as microseconds
OP_EMPTY = 9  # a=col8: an empty message, appends 1
OP_ONEOF = 10  # a=first entry of aux, b=count: at most one of these validity cols is set

# Value conversions (OP_VALUE a).
V_INT32, V_SINT32, V_SFIXED32 = 1, 2, 3
V_INT64, V_SINT64, V_SFIXED64 = 4, 5, 6
V_UINT32, V_FIXED32, V_UINT64, V_FIXED64 = 7, 8, 9, 10
V_FLOAT, V_DOUBLE, V_BOOL, V_STRING, V_BYTES, V_ENUM = 11, 12, 13, 14, 15, 16

_WIRE_VARINT, _WIRE_64, _WIRE_LEN, _WIRE_32 = 0, 1, 2, 5

#: field type -> (conv, wire type, slot kind, arena)
_SCALARS: dict[int, tuple[int, int, str, int]] = {
    F.TYPE_INT32: (V_INT32, _WIRE_VARINT, "int32", A32),
    F.TYPE_SINT32: (V_SINT32, _WIRE_VARINT, "int32", A32),
    F.TYPE_SFIXED32: (V_SFIXED32, _WIRE_32, "int32", A32),
    F.TYPE_INT64: (V_INT64, _WIRE_VARINT, "int64", A64),
    F.TYPE_SINT64: (V_SINT64, _WIRE_VARINT, "int64", A64),
    F.TYPE_SFIXED64: (V_SFIXED64, _WIRE_64, "int64", A64),
    F.TYPE_UINT32: (V_UINT32, _WIRE_VARINT, "int64", A64),
    F.TYPE_FIXED32: (V_FIXED32, _WIRE_32, "int64", A64),
    F.TYPE_UINT64: (V_UINT64, _WIRE_VARINT, "decimal", A64),
    F.TYPE_FIXED64: (V_FIXED64, _WIRE_64, "decimal", A64),
    F.TYPE_FLOAT: (V_FLOAT, _WIRE_32, "float32", A32),
    F.TYPE_DOUBLE: (V_DOUBLE, _WIRE_64, "float64", A64),
    F.TYPE_BOOL: (V_BOOL, _WIRE_VARINT, "bool", A8),
    F.TYPE_STRING: (V_STRING, _WIRE_LEN, "string", A64),
    F.TYPE_BYTES: (V_BYTES, _WIRE_LEN, "binary", A64),
    F.TYPE_ENUM: (V_ENUM, _WIRE_VARINT, "string", A64),
}


@dataclass(eq=False)
class ProtoProgram:
    """A compiled message: instructions, pads, enum tables, columns and the slot tree (a
    :class:`~..shared.arena_columns.ColumnProgram`)."""

    code: np.ndarray  # (n, 8) int64
    pads: np.ndarray  # (m, 4) int64
    aux: np.ndarray  # int64: oneof validity columns
    enum_numbers: np.ndarray  # int64, one per symbol
    symbol_offsets: np.ndarray  # int64
    symbol_data: np.ndarray  # uint8
    col_arena: np.ndarray
    col_offsets: np.ndarray
    root: Slot
    root_pads: tuple[int, int]
    depth: int  # stack entries a row can need


def compile_program(desc: Descriptor) -> ProtoProgram | None:
    """The program of a whole message of ``desc`` (expressible: :func:`.types.
    iceberg_type` accepted it), or None when the kernel does not handle its shape."""
    if _has_group(desc, set()):
        return None
    return _Compiler().compile(desc)


def _has_group(desc: Descriptor, seen: set[str]) -> bool:
    if desc.full_name in seen:
        return False
    seen.add(desc.full_name)
    for field in desc.fields:
        if field.type == F.TYPE_GROUP:
            return True
        if field.message_type is not None and _has_group(field.message_type, seen):
            return True
    return False


def _tag(number: int, wire: int) -> int:
    return (number << 3) | wire


def _implicit(field: FieldDescriptor) -> bool:
    """A singular field without presence: absent when default, never written as default."""
    return not field.is_repeated and not field.has_presence


class _Compiler:
    def __init__(self) -> None:
        self.arena: list[int] = []
        self.offsets: list[bool] = []
        self.code: list[list[int]] = []
        self.pads: list[tuple[int, int, int, int]] = []
        self.aux: list[int] = []
        self.enum_numbers: list[int] = []
        self.symbol_offsets: list[int] = [0]
        self.symbol_data = bytearray()
        self.enums: dict[str, tuple[int, int, int]] = {}  # name -> first, count, zero symbol
        self.depth = 1

    def compile(self, desc: Descriptor) -> ProtoProgram:
        root = self.struct_slot(desc, valid=True)
        self.emit(OP_VALID, root.valid)
        self.message_fields(desc, root, 1)
        self.emit(OP_END)
        first = len(self.pads)
        self.pads.extend(self.pad_list(root, None))
        return ProtoProgram(
            code=np.array(self.code, dtype=np.int64).reshape(-1, 8),
            pads=np.array(self.pads, dtype=np.int64).reshape(-1, 4),
            aux=np.array(self.aux or [0], dtype=np.int64),
            enum_numbers=np.array(self.enum_numbers or [0], dtype=np.int64),
            symbol_offsets=np.array(self.symbol_offsets, dtype=np.int64),
            symbol_data=np.frombuffer(bytes(self.symbol_data) or b"\0", dtype=np.uint8),
            col_arena=np.array(self.arena, dtype=np.int64),
            col_offsets=np.array(self.offsets, dtype=np.bool_),
            root=root,
            root_pads=(first, len(self.pads) - first),
            depth=self.depth + 1,
        )

    # -- columns and slots ------------------------------------------------------------------

    def column(self, arena: int, offsets: bool = False) -> int:
        self.arena.append(arena)
        self.offsets.append(offsets)
        return len(self.arena) - 1

    def struct_slot(self, desc: Descriptor, valid: bool) -> Slot:
        slot = Slot("struct", self.column(A8) if valid else -1)
        slot.children = [self.field_slot(field) for field in desc.fields]
        return slot

    def field_slot(self, field: FieldDescriptor) -> Slot:
        if is_map(field):
            entry = field.message_type
            offsets = self.column(A64, True)
            key = self.value_slot(entry.fields_by_name["key"], False)
            value = self.value_slot(entry.fields_by_name["value"], False)
            return Slot("map", -1, offsets, drops=self.column(A64), children=[key, value])
        if field.is_repeated:
            offsets = self.column(A64, True)
            return Slot("list", -1, offsets, children=[self.value_slot(field, False)])
        return self.value_slot(field, is_optional(field))

    def value_slot(self, field: FieldDescriptor, nullable: bool) -> Slot:
        kind = "scalar" if field.message_type is None else message_kind(field.message_type)
        if kind == "struct":
            return self.struct_slot(field.message_type, nullable)
        valid = self.column(A8) if nullable else -1
        if kind == "scalar":
            return self.scalar_slot(field.type, valid)
        if kind in ("timestamp", "duration"):
            return Slot("int64", valid, self.column(A64))
        if kind == "wrapper":
            return self.scalar_slot(WRAPPERS[field.message_type.full_name], valid)
        return Slot("bool", valid, self.column(A8))  # empty

    def scalar_slot(self, field_type: int, valid: int) -> Slot:
        _, _, kind, arena = _SCALARS[field_type]
        if kind in ("string", "binary"):
            offsets = self.column(A64, True)
            return Slot(kind, valid, offsets, self.column(A8))
        return Slot(kind, valid, self.column(arena), width=2 if kind == "decimal" else 1)

    # -- code -------------------------------------------------------------------------------

    def emit(self, op: int, *operands: int) -> int:
        self.code.append([op, *operands, *([0] * (7 - len(operands)))])
        return len(self.code) - 1

    def message_fields(self, desc: Descriptor, slot: Slot, depth: int) -> None:
        """Code of a message's fields (in number order, as upb writes them)."""
        self.depth = max(self.depth, depth)
        by_field = dict(zip(desc.fields, slot.children, strict=True))
        for field in sorted(desc.fields, key=lambda f: f.number):
            self.field(field, by_field[field], depth)
        for oneof in desc.oneofs:
            if len(oneof.fields) > 1:
                first = len(self.aux)
                self.aux.extend(by_field[f].valid for f in oneof.fields)
                self.emit(OP_ONEOF, first, len(oneof.fields))

    def field_start(self, tag: int, absent: list[tuple[int, int, int, int]] | None,
                    repeat: bool) -> int:  # fmt: skip
        """An OP_FIELD (its absent target patched by :meth:`patch`); ``absent`` None: the
        field must be there."""
        first = len(self.pads)
        if absent is not None:
            self.pads.extend(absent)
        count = 0 if absent is None else len(absent)
        return self.emit(OP_FIELD, tag, -1, int(absent is None), first, count, int(repeat))

    def patch(self, at: int) -> None:
        self.code[at][2] = len(self.code)

    def field(self, field: FieldDescriptor, slot: Slot, depth: int) -> None:
        number = field.number
        if is_map(field):
            entry = field.message_type
            key_slot, value_slot = slot.children
            at = self.field_start(_tag(number, _WIRE_LEN), [(PAD_OFF, slot.col, 1, 0)], True)
            body = len(self.code)
            self.emit(OP_BEGIN)
            self.depth = max(self.depth, depth + 2)
            key, value = entry.fields_by_name["key"], entry.fields_by_name["value"]
            key_at = self.field_start(_tag(1, self.wire(key)), None, False)
            self.value(key, key_slot, False, depth + 2)
            self.patch(key_at)
            value_at = self.field_start(_tag(2, self.wire(value)), None, False)
            self.value(value, value_slot, False, depth + 2)
            self.patch(value_at)
            self.emit(OP_FINISH)
            self.emit(OP_AGAIN, _tag(number, _WIRE_LEN), body, slot.col, 1)
            self.patch(at)
            return
        if field.is_repeated:
            element = slot.children[0]
            absent = [(PAD_OFF, slot.col, 1, 0)]
            if field.message_type is None and field.is_packed:
                at = self.field_start(_tag(number, _WIRE_LEN), absent, False)
                conv = _SCALARS[field.type][0]
                first, count = self.enum_table(field)
                self.emit(OP_PACKED, conv, slot.col, element.col, element.data, first, count)
                self.patch(at)
                return
            at = self.field_start(_tag(number, self.wire(field)), absent, True)
            body = len(self.code)
            self.depth = max(self.depth, depth + 1)
            self.value(field, element, False, depth + 1)
            self.emit(OP_AGAIN, _tag(number, self.wire(field)), body, slot.col, 0)
            self.patch(at)
            return
        implicit = _implicit(field)
        absent = self.pad_list(slot, field if implicit else None)
        at = self.field_start(_tag(number, self.wire(field)), absent, False)
        if slot.valid >= 0:
            self.emit(OP_VALID, slot.valid)
        self.value(field, slot, implicit, depth)
        self.patch(at)

    def wire(self, field: FieldDescriptor) -> int:
        if field.message_type is not None:
            return _WIRE_LEN
        return _SCALARS[field.type][1]

    def value(self, field: FieldDescriptor, slot: Slot, implicit: bool, depth: int) -> None:
        """Code reading one value of ``field`` after its tag (validity set by the caller)."""
        if field.message_type is None:
            self.scalar(field.type, slot, implicit, field)
            return
        desc = field.message_type
        kind = message_kind(desc)
        if kind in ("timestamp", "duration"):
            self.emit(OP_TIME, slot.col, int(kind == "duration"))
        elif kind == "empty":
            self.emit(OP_EMPTY, slot.col)
        elif kind == "wrapper":
            self.emit(OP_BEGIN)
            self.depth = max(self.depth, depth + 1)
            inner = desc.fields_by_name["value"]
            at = self.field_start(_tag(1, self.wire(inner)), self.value_pads(slot, inner), False)
            self.scalar(inner.type, slot, True, inner)
            self.patch(at)
            self.emit(OP_FINISH)
        else:
            self.emit(OP_BEGIN)
            self.message_fields(desc, slot, depth + 1)
            self.emit(OP_FINISH)

    def scalar(self, field_type: int, slot: Slot, implicit: bool, field: FieldDescriptor) -> None:
        conv = _SCALARS[field_type][0]
        first, count = self.enum_table(field)
        self.emit(OP_VALUE, conv, slot.col, slot.data, int(implicit), first, count)

    def enum_table(self, field: FieldDescriptor) -> tuple[int, int]:
        """The first symbol and symbol count of ``field``'s enum (0, 0 if not an enum): one
        symbol per number, named by the enum's first value of that number."""
        if field.type != F.TYPE_ENUM:
            return 0, 0
        enum = field.enum_type
        known = self.enums.get(enum.full_name)
        if known is not None:
            return known[0], known[1]
        first = len(self.enum_numbers)
        names: dict[int, str] = {}
        for value in enum.values:
            names.setdefault(value.number, value.name)
        zero = -1
        for number, name in names.items():
            if number == 0:
                zero = len(self.enum_numbers)
            self.enum_numbers.append(number)
            self.symbol_data += name.encode()
            self.symbol_offsets.append(len(self.symbol_data))
        self.enums[enum.full_name] = (first, len(names), zero)
        return first, len(names)

    # -- pads -------------------------------------------------------------------------------

    def value_pads(self, slot: Slot, field: FieldDescriptor | None) -> list[tuple[int, ...]]:
        """What an absent scalar appends to its value column: its default for an implicit
        ``field`` (an enum's zero name), zeros or an empty string otherwise."""
        if slot.kind in ("string", "binary"):
            if field is not None and field.type == F.TYPE_ENUM:
                self.enum_table(field)
                zero = self.enums[field.enum_type.full_name][2]
                if zero < 0:
                    raise ValueError("an implicit-presence enum without a zero value")
                return [(PAD_SYM, slot.col, slot.data, zero)]
            return [(PAD_OFF, slot.col, 1, 0)]
        kind = {A64: PAD_Z64, A32: PAD_Z32, A8: PAD_Z8}[self.arena[slot.col]]
        return [(kind, slot.col, slot.width, 0)]

    def pad_list(self, slot: Slot, field: FieldDescriptor | None) -> list[tuple[int, ...]]:
        """What an absent value of ``slot`` appends to each of its columns."""
        out: list[tuple[int, ...]] = []
        if slot.valid >= 0:
            out.append((PAD_Z8, slot.valid, 1, 0))
        if slot.kind == "struct":
            for child in slot.children:
                out.extend(self.pad_list(child, None))
        elif slot.kind in ("list", "map"):
            out.append((PAD_OFF, slot.col, 1, 0))
        else:
            out.extend(self.value_pads(slot, field))
        return out
