"""Vectorized canonical JSON writing for the json-schema codec: an Arrow array of decoded values
(the type the codec's ``decode`` gives) to one payload per row, by the compiled writer
(:mod:`.encode_kernel`).

The schema's node tree is compiled into a flat program and a tree of :class:`_Slot` saying
which columns hold each Arrow array; every value has a validity column. The value array is
flattened into those columns (longs, timestamps and doubles' bits int64, dates int32,
booleans, validity and uuids' 16 bytes uint8, strings and JSON text offsets and bytes, lists
and maps offsets), packed into three arenas, and the kernel writes the rows. Rows it cannot
write (see the kernel) come back flagged and are written by the codec's Python writer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from json.encoder import encode_basestring  # type: ignore[attr-defined]
from typing import Any

import numpy as np
import pyarrow as pa

from bergstream.plugins.value_codecs.json_schema import encode_kernel as k
from bergstream.plugins.value_codecs.json_schema.types import JsonNode
from bergstream.plugins.value_codecs.shared.flatten import (
    ARENA_DTYPES,
    bits,
    entries,
    pack,
    strings,
    window,
)

__all__ = ["EncodeProgram", "JsonEncoder", "compile_encoder"]

_A64, _A32, _A8 = 0, 1, 2
_WIDTH = 8
_SMALL_STRINGS = 1 << 22  # bytes of one string column
_LEAVES = {
    "long": (k.OP_LONG, _A64),
    "timestamptz": (k.OP_TIMESTAMP, _A64),
    "double": (k.OP_DOUBLE, _A64),
    "boolean": (k.OP_BOOL, _A8),
    "date": (k.OP_DATE, _A32),
    "uuid": (k.OP_UUID, _A8),
}


@dataclass(eq=False)
class _Slot:
    """One Arrow array of the value and its columns: ``col`` holds the values (offsets for
    string, json, list and map), ``data`` a string's bytes, ``width`` slots per value;
    ``prefix`` is the length of the ``"name":`` written before a struct field's value."""

    kind: str
    valid: int
    col: int = -1
    data: int = -1
    width: int = 1
    children: list[_Slot] = field(default_factory=list)
    prefix: int = 0


@dataclass(eq=False)
class EncodeProgram:
    """A compiled schema: instructions, pads, key literals, column arenas, the slot tree."""

    code: np.ndarray  # (n, 8) int64
    pads: np.ndarray  # (m, 2) int64: column, slots an absent value takes in it
    literals: np.ndarray  # uint8: the ``"name":`` of every struct field
    col_arena: list[int]
    root: _Slot
    depth: int


def compile_encoder(node: JsonNode) -> EncodeProgram:
    """The program writing values of ``node``."""
    return _Compiler().compile(node)


class _Compiler:
    def __init__(self) -> None:
        self.arena: list[int] = []
        self.code: list[list[int]] = []
        self.pads: list[tuple[int, int]] = []
        self.literals = bytearray()
        self.depth = 0

    def compile(self, node: JsonNode) -> EncodeProgram:
        root = self.slot(node)
        self.item(node, root, 1)
        self.emit(k.OP_END)
        return EncodeProgram(
            code=np.array(self.code, dtype=np.int64).reshape(-1, _WIDTH),
            pads=np.array(self.pads, dtype=np.int64).reshape(-1, 2),
            literals=np.frombuffer(bytes(self.literals) or b"\0", dtype=np.uint8),
            col_arena=self.arena,
            root=root,
            depth=self.depth,
        )

    def column(self, arena: int) -> int:
        self.arena.append(arena)
        return len(self.arena) - 1

    def slot(self, node: JsonNode) -> _Slot:
        valid = self.column(_A8)
        kind = node.kind
        if kind in _LEAVES:
            return _Slot(
                kind, valid, self.column(_LEAVES[kind][1]), width=16 if kind == "uuid" else 1
            )
        if kind in ("string", "json"):
            return _Slot(kind, valid, self.column(_A64), self.column(_A8))
        if kind == "list":
            assert node.items is not None
            return _Slot(kind, valid, self.column(_A64), children=[self.slot(node.items)])
        if kind == "map":
            assert node.items is not None
            offsets = self.column(_A64)
            keys = _Slot("string", -1, self.column(_A64), self.column(_A8))
            return _Slot(kind, valid, offsets, children=[keys, self.slot(node.items)])
        return _Slot("struct", valid, children=[self.slot(f.node) for f in node.fields])

    def emit(self, op: int, *operands: int) -> int:
        self.code.append([op, *operands, *([0] * (_WIDTH - 1 - len(operands)))])
        return len(self.code) - 1

    def pad_block(self, slot: _Slot) -> tuple[int, int]:
        """The pads of an absent value of ``slot`` (its validity slot excepted)."""
        start = len(self.pads)
        self._pads(slot, own_valid=False)
        return start, len(self.pads) - start

    def _pads(self, slot: _Slot, own_valid: bool) -> None:
        if own_valid:
            self.pads.append((slot.valid, 1))
        if slot.kind == "struct":
            for child in slot.children:
                self._pads(child, own_valid=True)
        else:
            self.pads.append((slot.col, slot.width))

    def item(self, node: JsonNode, slot: _Slot, depth: int) -> None:
        """A value that is written ``null`` when absent (list items, map values, the root)."""
        first, count = self.pad_block(slot)
        at = self.emit(k.OP_NULLABLE, slot.valid, first, count, -1)
        self.plain(node, slot, depth)
        self.code[at][4] = len(self.code)

    def plain(self, node: JsonNode, slot: _Slot, depth: int) -> None:
        """A value known to be there."""
        kind = node.kind
        self.depth = max(self.depth, depth)
        if kind in _LEAVES:
            self.emit(_LEAVES[kind][0], slot.col)
        elif kind in ("string", "json"):
            self.emit(k.OP_STRING if kind == "string" else k.OP_TEXT, slot.col, slot.data)
        elif kind == "list":
            assert node.items is not None
            start = self.emit(k.OP_LIST, slot.col, -1)
            self.item(node.items, slot.children[0], depth + 1)
            self.emit(k.OP_LIST_NEXT, start + 1)
            self.code[start][2] = len(self.code)
        elif kind == "map":
            assert node.items is not None
            keys, value = slot.children
            start = self.emit(k.OP_MAP, slot.col, -1)
            self.emit(k.OP_MAP_KEY, keys.col, keys.data)
            self.item(node.items, value, depth + 1)
            self.emit(k.OP_MAP_NEXT, start + 1)
            self.code[start][2] = len(self.code)
        else:
            self.emit(k.OP_OBJECT)
            for json_field, child in zip(node.fields, slot.children, strict=True):
                literal = (encode_basestring(json_field.name) + ":").encode()
                child.prefix = len(literal)
                first = len(self.literals)
                self.literals += literal
                omit = int(not json_field.node.nullable)  # a null is left out, not ``null``
                pads = self.pad_block(child)
                at = self.emit(k.OP_FIELD, child.valid, first, len(literal), omit, *pads, -1)
                self.plain(json_field.node, child, depth + 1)
                self.code[at][7] = len(self.code)
            self.emit(k.OP_CLOSE)


class JsonEncoder:
    """Writes Arrow values of ``arrow_type`` as canonical JSON with one compiled schema; rows
    the kernel leaves out are written with ``write_row`` (the codec's Python writer)."""

    def __init__(
        self, program: EncodeProgram, arrow_type: pa.DataType, write_row: Callable[[Any], str]
    ) -> None:
        self.program = program
        self.arrow_type = arrow_type
        self.write_row = write_row

    def accepts(self, values: pa.Array) -> bool:
        """Whether ``values`` has the type this encoder reads."""
        return values.type == self.arrow_type

    def encode(self, values: pa.Array) -> pa.Array:
        """One payload per row (``large_binary``); ``values`` (of :attr:`arrow_type`, one
        array) has no null rows."""
        rows = len(values)
        program = self.program
        columns: list[np.ndarray | None] = [None] * len(program.col_arena)
        _flatten(program.root, values, columns)
        arenas, base = pack(program.col_arena, columns)
        # The worst case: untouched pages of np.empty cost nothing.
        out = np.empty(_room(program.root, columns) + 64, dtype=np.uint8)
        offsets = np.empty(rows + 1, dtype=np.int64)
        fallback = np.zeros(rows, dtype=np.uint8)
        stack = np.zeros(program.depth + 2, dtype=np.int64)
        short = k.write_rows(
            rows, program.code, program.pads, program.literals, *arenas, base, stack, out,
            offsets, fallback,
        )  # fmt: skip
        if short >= 0:
            raise AssertionError(f"the output of row {short} outgrew its worst case")
        slow = np.flatnonzero(fallback)
        if slow.size:
            out, offsets = self._splice(values, out, offsets, slow)
        size = int(offsets[rows])
        buffers = [None, pa.py_buffer(offsets), pa.py_buffer(out[:size])]
        return pa.Array.from_buffers(pa.large_binary(), rows, buffers)

    def _splice(
        self, values: pa.Array, out: np.ndarray, offsets: np.ndarray, slow: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The output with the rows ``slow`` (empty in it) written by the Python writer."""
        texts = [
            self.write_row(value).encode("utf-8")
            for value in values.take(pa.array(slow)).to_pylist()
        ]
        lengths = np.diff(offsets)
        lengths[slow] = [len(text) for text in texts]
        new_offsets = np.zeros(len(offsets), dtype=np.int64)
        np.cumsum(lengths, out=new_offsets[1:])
        new_out = np.empty(int(new_offsets[-1]), dtype=np.uint8)
        done = 0  # rows before this one are in new_out
        for row, text in zip(slow.tolist(), texts, strict=True):
            old, new = int(offsets[done]), int(new_offsets[done])
            count = int(offsets[row]) - old
            new_out[new : new + count] = out[old : old + count]
            at = int(new_offsets[row])
            new_out[at : at + len(text)] = np.frombuffer(text, dtype=np.uint8)
            done = row + 1
        old, new = int(offsets[done]), int(new_offsets[done])
        count = int(offsets[-1]) - old
        new_out[new : new + count] = out[old : old + count]
        return new_out, new_offsets


def _room(slot: _Slot, columns: list[np.ndarray | None]) -> int:
    """The most bytes the values of ``slot`` (with their field names) can take."""
    column = columns[slot.valid] if slot.valid >= 0 else columns[slot.col]
    assert column is not None
    entries = column.size if slot.valid >= 0 else column.size - 1
    room = entries * (slot.prefix + k.VALUE_ROOM)
    if slot.data >= 0:
        data = columns[slot.data]
        assert data is not None
        # The worst case, unless that would reserve much: then the exact count.
        small = data.size <= _SMALL_STRINGS
        room += data.size * k.STRING_ROOM if small else k.escaped_size(data)
    return room + sum(_room(child, columns) for child in slot.children)


def _flatten(slot: _Slot, array: pa.Array, columns: list[np.ndarray | None]) -> None:
    """Fill ``columns`` with the slots of ``array`` (an array of ``slot``'s values)."""
    length = len(array)
    if slot.valid >= 0:
        columns[slot.valid] = (
            bits(array.buffers()[0], array.offset, length)
            if array.null_count
            else np.ones(length, dtype=np.uint8)
        )
    kind = slot.kind
    if kind == "struct":
        for i, child in enumerate(slot.children):
            _flatten(child, array.field(i), columns)
    elif kind in ("list", "map"):
        _flatten_repeated(slot, array, columns)
    elif kind in ("string", "json"):
        columns[slot.col], columns[slot.data] = strings(array)
    elif kind == "boolean":
        columns[slot.col] = bits(array.buffers()[1], array.offset, length)
    else:
        if isinstance(array, pa.ExtensionArray):
            array = array.storage
        dtype = ARENA_DTYPES[_LEAVES[kind][1]]
        columns[slot.col] = window(
            array.buffers()[1], dtype, array.offset * slot.width, length * slot.width
        )


def _flatten_repeated(slot: _Slot, array: pa.Array, columns: list[np.ndarray | None]) -> None:
    """A list or map: offsets from 0, children sliced to the entries it uses (a null entry
    with a non-empty range, which Arrow allows, loses its elements)."""
    valid = bits(array.buffers()[0], array.offset, len(array)) if array.null_count else None
    columns[slot.col], child = entries(array, valid)
    if slot.kind == "list":
        _flatten(slot.children[0], child, columns)
    else:
        _flatten(slot.children[0], child.field(0), columns)
        _flatten(slot.children[1], child.field(1), columns)
