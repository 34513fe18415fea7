"""A parsed JSON Schema compiled for the JSON kernel (:mod:`.decode_kernel`), and the decoder that
runs it over a batch and turns its columns into an Arrow array without copies.

The columns, the :class:`~..shared.slot.Slot` tree and the assembly into Arrow are the ones the
Avro decoder uses too (:mod:`..shared.arena_columns`): every value has a validity column (all-valid
ones get no bitmap), longs and timestamps are int64, doubles int64 slots holding float64 bits,
dates int32, uuids 16 bytes, strings offsets and bytes, lists and maps offsets (a map's
dropped-entries column stays empty: a map with a repeated key is never canonical).

Schemas with a JSON-text column (kind ``json``) are not compiled (:func:`compile_json` gives
None): the codec decodes them the general way.
"""

from __future__ import annotations

from dataclasses import dataclass
from json.encoder import encode_basestring  # type: ignore[attr-defined]

import numpy as np
import pyarrow as pa

from bergstream.plugins.value_codecs.json_schema import decode_kernel as k
from bergstream.plugins.value_codecs.json_schema.types import JsonNode
from bergstream.plugins.value_codecs.shared import arena_layout as ops
from bergstream.plugins.value_codecs.shared.arena_columns import (
    ArenaColumns,
    Arenas,
    payload_buffers,
)
from bergstream.plugins.value_codecs.shared.slot import Slot

__all__ = ["JsonDecoder", "JsonProgram", "compile_json"]

_WIDTH = 8


@dataclass(eq=False)
class JsonProgram:
    """A compiled schema: instructions, pads, key literals, columns, the slot tree."""

    code: np.ndarray  # (n, 8) int64
    pads: np.ndarray  # (m, 3) int64: kind, col, slots
    literals: np.ndarray  # uint8: the ``"name":`` of every struct field
    col_arena: np.ndarray  # int64 per column: A64, A32 or A8
    col_offsets: np.ndarray  # bool per column: an offsets column (starts with a 0)
    root: Slot
    root_pads: tuple[int, int]
    depth: int  # deepest nesting of objects, lists and maps


def _has_json_text(node: JsonNode) -> bool:
    if node.kind == "json":
        return True
    if node.items is not None and _has_json_text(node.items):
        return True
    return any(_has_json_text(field.node) for field in node.fields)


def compile_json(node: JsonNode) -> JsonProgram | None:
    """The program reading canonical values of ``node``; None if it has a JSON-text column."""
    if _has_json_text(node):
        return None
    return _Compiler().compile(node)


class _Compiler:
    def __init__(self) -> None:
        self.arena: list[int] = []
        self.offsets: list[bool] = []
        self.code: list[list[int]] = []
        self.pads: list[tuple[int, int, int]] = []
        self.literals = bytearray()
        self.depth = 0

    def compile(self, node: JsonNode) -> JsonProgram:
        root = self.slot(node)
        self.emit(k.OP_VALID, root.valid)  # a JSON null value is an error: never canonical
        self.plain(node, root, 1)
        self.emit(k.OP_END)
        root_pads = self.pad_block(self.pad_list(root))
        return JsonProgram(
            code=np.array(self.code, dtype=np.int64).reshape(-1, _WIDTH),
            pads=np.array(self.pads, dtype=np.int64).reshape(-1, 3),
            literals=np.frombuffer(bytes(self.literals) or b"\0", dtype=np.uint8),
            col_arena=np.array(self.arena, dtype=np.int64),
            col_offsets=np.array(self.offsets, dtype=np.bool_),
            root=root,
            root_pads=root_pads,
            depth=self.depth,
        )

    def column(self, arena: int, offsets: bool = False) -> int:
        self.arena.append(arena)
        self.offsets.append(offsets)
        return len(self.arena) - 1

    def slot(self, node: JsonNode) -> Slot:
        valid = self.column(ops.A8)
        kind = node.kind
        if kind in ("long", "timestamptz"):
            return Slot("int64", valid, self.column(ops.A64))
        if kind == "double":
            return Slot("float64", valid, self.column(ops.A64))
        if kind == "boolean":
            return Slot("bool", valid, self.column(ops.A8))
        if kind == "date":
            return Slot("int32", valid, self.column(ops.A32))
        if kind == "uuid":
            return Slot("uuid", valid, self.column(ops.A8), width=16)
        if kind == "string":
            return Slot("string", valid, self.column(ops.A64, True), self.column(ops.A8))
        assert kind not in ("json",)
        if kind == "list":
            assert node.items is not None
            offsets = self.column(ops.A64, True)
            return Slot("list", valid, offsets, children=[self.slot(node.items)])
        if kind == "map":
            assert node.items is not None
            offsets = self.column(ops.A64, True)
            keys = Slot("string", -1, self.column(ops.A64, True), self.column(ops.A8))
            value = self.slot(node.items)
            drops = self.column(ops.A64)
            return Slot("map", valid, offsets, drops=drops, children=[keys, value])
        return Slot("struct", valid, children=[self.slot(f.node) for f in node.fields])

    def emit(self, op: int, *operands: int) -> int:
        self.code.append([op, *operands, *([0] * (_WIDTH - 1 - len(operands)))])
        return len(self.code) - 1

    def value(self, node: JsonNode, slot: Slot, depth: int) -> None:
        """Code reading a value of ``node`` (or null, if it admits null) into ``slot``."""
        if node.nullable:
            first, count = self.pad_block(self.pad_list(slot))
            at = self.emit(k.OP_NULLABLE, slot.valid, first, count, -1)
            self.plain(node, slot, depth)
            self.code[at][4] = len(self.code)
        else:
            self.emit(k.OP_VALID, slot.valid)
            self.plain(node, slot, depth)

    def plain(self, node: JsonNode, slot: Slot, depth: int) -> None:
        kind = node.kind
        leaf = {
            "long": k.OP_LONG, "double": k.OP_DOUBLE, "boolean": k.OP_BOOL,
            "timestamptz": k.OP_TIMESTAMP, "date": k.OP_DATE, "uuid": k.OP_UUID,
        }  # fmt: skip
        self.depth = max(self.depth, depth)
        if kind in leaf:
            self.emit(leaf[kind], slot.col)
        elif kind == "string":
            self.emit(k.OP_STRING, slot.col, slot.data)
        elif kind == "list":
            assert node.items is not None
            start = self.emit(k.OP_LIST, slot.col, -1)
            self.value(node.items, slot.children[0], depth + 1)
            self.emit(k.OP_LIST_NEXT, start + 1, slot.col)
            self.code[start][2] = len(self.code)
        elif kind == "map":
            assert node.items is not None
            keys, item = slot.children
            start = self.emit(k.OP_MAP, slot.col, -1)
            self.emit(k.OP_MAP_KEY, keys.col, keys.data)
            self.value(node.items, item, depth + 1)
            self.emit(k.OP_MAP_NEXT, start + 1, slot.col, keys.col, keys.data)
            self.code[start][2] = len(self.code)
        else:
            self.emit(k.OP_OBJECT)
            for field, child in zip(node.fields, slot.children, strict=True):
                literal = (encode_basestring(field.name) + ":").encode()
                first = len(self.literals)
                self.literals += literal
                optional = not field.listed_required and not field.node.nullable
                pads = self.pad_block(self.pad_list(child))
                at = self.emit(k.OP_FIELD, first, len(literal), int(optional), *pads, -1)
                self.value(field.node, child, depth + 1)
                self.code[at][6] = len(self.code)
            self.emit(k.OP_CLOSE)

    def pad_list(self, slot: Slot) -> list[tuple[int, int, int]]:
        """What an absent value of ``slot`` appends to each of its columns."""
        out: list[tuple[int, int, int]] = []
        if slot.valid >= 0:
            out.append((ops.PAD_Z8, slot.valid, 1))
        if slot.kind == "struct":
            for child in slot.children:
                out.extend(self.pad_list(child))
        elif slot.kind in ("list", "map", "string"):
            out.append((ops.PAD_OFF, slot.col, 1))
        else:
            arena = self.arena[slot.col]
            kind = {ops.A64: ops.PAD_Z64, ops.A32: ops.PAD_Z32, ops.A8: ops.PAD_Z8}[arena]
            out.append((kind, slot.col, slot.width))
        return out

    def pad_block(self, pads: list[tuple[int, int, int]]) -> tuple[int, int]:
        start = len(self.pads)
        self.pads.extend(pads)
        return start, len(pads)


class JsonDecoder:
    """Reads the canonical rows of a batch with a compiled program into Arrow values; says
    which rows it gave up on (they are null in its array)."""

    def __init__(self, program: JsonProgram, arrow_type: pa.DataType) -> None:
        self.program = program
        self.arrow_type = arrow_type
        self._columns = ArenaColumns(program, arrow_type)

    def decode(self, payloads: pa.Array, skip: int = 0) -> tuple[pa.Array, np.ndarray]:
        """The values of every payload (null where the kernel gave up) and the rows it gave up
        on (bool)."""
        data, offsets = payload_buffers(payloads)
        rows = len(offsets) - 1
        fallback = np.zeros(rows, dtype=np.uint8)
        program = self.program
        stack = np.zeros((program.depth + 1, 2), dtype=np.int64)

        def kernel(start: int, arenas: Arenas) -> tuple[int, int, int]:
            a64, a32, a8 = arenas.arrays
            return k.read_rows(
                data, offsets, skip, start, program.code, program.pads, program.literals,
                program.root_pads[0], program.root_pads[1], a64, a64.view(np.float64), a32, a8,
                arenas.base, arenas.cap, arenas.length, fallback, stack,
            )  # fmt: skip

        values = self._columns.run(offsets, skip, kernel)
        return values, fallback.view(bool)
