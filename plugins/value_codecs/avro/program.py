"""An Avro schema compiled into a flat program (see :mod:`.ops`) and the tree of
:class:`..shared.slot.Slot` that says which columns hold each Arrow array of the decoded value.

The same program drives both kernels: the decoder reads Avro and appends to columns, the encoder
reads columns and writes Avro. Its shape mirrors :func:`.types.iceberg_type` exactly: null
fields have no column, ``[null, T]`` is a nullable T, other unions a struct of nullable branches.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bergstream.core.api import SchemaNotExpressible
from bergstream.plugins.value_codecs.avro import ops
from bergstream.plugins.value_codecs.avro.schema import AvroNode
from bergstream.plugins.value_codecs.avro.types import is_null, union_parts
from bergstream.plugins.value_codecs.shared.slot import Slot

__all__ = ["Program", "compile_program"]

_INT32_LOGICAL = frozenset({"date"})
_MICROS_LOGICAL = frozenset({"time-micros", "timestamp-micros", "local-timestamp-micros"})
_MILLIS_LOGICAL = frozenset({"timestamp-millis", "local-timestamp-millis"})


@dataclass(eq=False)
class Program:
    """A compiled schema: the instructions and their tables, the columns, the slot tree."""

    code: np.ndarray  # (n, 6) int64
    jumps: np.ndarray  # union jump tables
    selectors: np.ndarray  # per jump-table entry: validity col that selects it, or SEL_*
    pads: np.ndarray  # (m, 3) int64: kind, col, slots
    symbol_offsets: np.ndarray  # int64, enum symbols' bounds in symbol_data
    symbol_data: np.ndarray  # uint8
    col_arena: np.ndarray  # int64 per column: A64, A32 or A8
    col_offsets: np.ndarray  # bool per column: an offsets column (starts with a 0)
    root: Slot
    root_pads: tuple[int, int]  # first pad and count: what a failed row is filled with
    root_nullable: bool  # the value's schema is a union with null (a null value is valid)
    depth: int  # deepest nesting of arrays and maps


def compile_program(node: AvroNode) -> Program:
    """Compile a value schema (expressible: :func:`.types.iceberg_type` accepted it)."""
    return _Compiler().compile(node)


class _Compiler:
    def __init__(self) -> None:
        self.arena: list[int] = []
        self.offsets: list[bool] = []
        self.code: list[list[int]] = []
        self.jumps: list[int] = []
        self.selectors: list[int] = []
        self.pads: list[tuple[int, int, int]] = []
        self.symbol_offsets: list[int] = [0]
        self.symbol_data = bytearray()
        self.depth = 0

    def compile(self, node: AvroNode) -> Program:
        root = self.slot(node)
        if root is None:
            raise SchemaNotExpressible("the value's schema is null: no column can hold it")
        nullable = root.valid >= 0
        if not nullable:
            root.valid = self.column(ops.A8)
            self.emit(ops.OP_VALID, root.valid)
        self.value(node, root, 0)
        self.emit(ops.OP_END)
        root_pads = self.pad_block(root)
        return Program(
            code=np.array(self.code, dtype=np.int64).reshape(-1, 6),
            jumps=np.array(self.jumps, dtype=np.int64),
            selectors=np.array(self.selectors, dtype=np.int64),
            pads=np.array(self.pads, dtype=np.int64).reshape(-1, 3),
            symbol_offsets=np.array(self.symbol_offsets, dtype=np.int64),
            symbol_data=np.frombuffer(bytes(self.symbol_data) or b"\0", dtype=np.uint8),
            col_arena=np.array(self.arena, dtype=np.int64),
            col_offsets=np.array(self.offsets, dtype=np.bool_),
            root=root,
            root_pads=root_pads,
            root_nullable=nullable,
            depth=self.depth,
        )

    # -- columns and slots ------------------------------------------------------------------

    def column(self, arena: int, offsets: bool = False) -> int:
        self.arena.append(arena)
        self.offsets.append(offsets)
        return len(self.arena) - 1

    def slot(self, node: AvroNode) -> Slot | None:
        """The slot of a value of ``node`` (None for a union of nulls only)."""
        if node.kind != "union":
            return self.plain_slot(node, False)
        branches, nullable = union_parts(node)
        if not branches:
            return None
        if len(branches) == 1:
            return self.plain_slot(branches[0], nullable)
        valid = self.column(ops.A8) if nullable else -1
        children = [self.plain_slot(b, True) for b in branches]
        return Slot("struct", valid=valid, children=children)

    def plain_slot(self, node: AvroNode, nullable: bool) -> Slot:
        """The slot of a node that is not a union."""
        valid = self.column(ops.A8) if nullable else -1
        logical, kind = node.logical, node.kind
        if logical == "decimal":
            return Slot("decimal", valid, self.column(ops.A64), width=2)
        if logical == "uuid":
            return Slot("uuid", valid, self.column(ops.A8), width=16)
        if logical in _INT32_LOGICAL or (kind == "int" and logical is None):
            return Slot("int32", valid, self.column(ops.A32))
        if kind in ("long", "int"):  # time-millis, times and timestamps in microseconds
            return Slot("int64", valid, self.column(ops.A64))
        simple = {"boolean": ("bool", ops.A8), "float": ("float32", ops.A32),
                  "double": ("float64", ops.A64)}  # fmt: skip
        if kind in simple:
            name, arena = simple[kind]
            return Slot(name, valid, self.column(arena))
        if kind in ("string", "bytes", "enum"):
            offsets = self.column(ops.A64, offsets=True)
            data = self.column(ops.A8)
            return Slot("binary" if kind == "bytes" else "string", valid, offsets, data)
        if kind == "fixed":
            return Slot("fixed", valid, self.column(ops.A8), width=node.size)
        if kind == "array":
            offsets = self.column(ops.A64, offsets=True)
            item = self.slot(_items(node))
            if item is None:
                raise SchemaNotExpressible("a list of nulls has no Iceberg type")
            return Slot("list", valid, offsets, children=[item])
        if kind == "map":
            offsets = self.column(ops.A64, offsets=True)
            keys = Slot("string", -1, self.column(ops.A64, True), self.column(ops.A8))
            value = self.slot(_items(node))
            if value is None:
                raise SchemaNotExpressible("a map of nulls has no Iceberg type")
            drops = self.column(ops.A64)
            return Slot("map", valid, offsets, drops=drops, children=[keys, value])
        if kind == "record":
            children = []
            for _, child in node.fields:
                if not is_null(child):
                    sub = self.slot(child)
                    assert sub is not None
                    children.append(sub)
            return Slot("struct", valid, children=children)
        raise SchemaNotExpressible(f"a {kind} value has no Iceberg type")

    # -- code -------------------------------------------------------------------------------

    def emit(self, op: int, *operands: int) -> int:
        self.code.append([op, *operands, *([0] * (5 - len(operands)))])
        return len(self.code) - 1

    def value(self, node: AvroNode, slot: Slot | None, depth: int) -> None:
        """Code decoding one value of ``node`` into ``slot`` (validity set by the caller,
        except for unions, which set their own)."""
        if node.kind == "union":
            self.union(node, slot, depth)
        elif node.kind != "null":
            assert slot is not None
            self.plain(node, slot, depth)

    def union(self, node: AvroNode, slot: Slot | None, depth: int) -> None:
        branches, nullable = union_parts(node)
        general = len(branches) > 1
        struct_valid = slot.valid if general and nullable and slot is not None else -1
        base = len(self.jumps)
        self.emit(ops.OP_UNION, len(node.branches), base, struct_valid)
        self.jumps.extend([0] * len(node.branches))
        self.selectors.extend([ops.SEL_NULL] * len(node.branches))
        to_end: list[int] = []
        non_null = [i for i, b in enumerate(node.branches) if b.kind != "null"]
        for position, index in enumerate(non_null):
            assert slot is not None
            self.jumps[base + index] = len(self.code)
            if not general:
                self.selectors[base + index] = slot.valid if nullable else ops.SEL_ALWAYS
                if nullable:
                    self.emit(ops.OP_VALID, slot.valid)
                self.plain(node.branches[index], slot, depth)
            else:
                target = slot.children[position]
                self.selectors[base + index] = target.valid
                if nullable:
                    self.emit(ops.OP_VALID, slot.valid)
                others = [c for c in slot.children if c is not target]
                self.nullfill([p for other in others for p in self.pad_list(other)])
                self.emit(ops.OP_VALID, target.valid)
                self.plain(node.branches[index], target, depth)
            to_end.append(self.emit(ops.OP_JUMP, -1))
        null_pc = len(self.code)
        if slot is not None and nullable:
            self.nullfill(self.pad_list(slot))
        for index, branch in enumerate(node.branches):
            if branch.kind == "null":
                self.jumps[base + index] = null_pc
        for pc in to_end:
            self.code[pc][1] = len(self.code)

    def plain(self, node: AvroNode, slot: Slot, depth: int) -> None:
        logical, kind = node.logical, node.kind
        if logical == "decimal":
            if kind == "bytes":
                self.emit(ops.OP_DEC_BYTES, slot.col, node.precision)
            else:
                self.emit(ops.OP_DEC_FIXED, slot.col, node.size, node.precision)
        elif logical == "uuid":
            if kind == "string":
                self.emit(ops.OP_UUID, slot.col)
            else:
                self.emit(ops.OP_FIXED, slot.col, 16)
        elif logical == "time-millis":
            self.emit(ops.OP_TIME_MILLIS, slot.col)
        elif logical in _MILLIS_LOGICAL:
            self.emit(ops.OP_TS_MILLIS, slot.col)
        elif logical in _MICROS_LOGICAL:
            self.emit(ops.OP_LONG, slot.col)
        elif kind in ("int", "long", "float", "double", "boolean"):
            op = {"int": ops.OP_INT, "long": ops.OP_LONG, "float": ops.OP_FLOAT,
                  "double": ops.OP_DOUBLE, "boolean": ops.OP_BOOL}[kind]  # fmt: skip
            self.emit(op, slot.col)
        elif kind in ("string", "bytes"):
            self.emit(ops.OP_STRING, slot.col, slot.data, int(kind == "string"))
        elif kind == "enum":
            first = len(self.symbol_offsets) - 1
            for symbol in node.symbols:
                self.symbol_data += symbol.encode()
                self.symbol_offsets.append(len(self.symbol_data))
            self.emit(ops.OP_ENUM, slot.col, slot.data, len(node.symbols), first)
        elif kind == "fixed":
            self.emit(ops.OP_FIXED, slot.col, node.size)
        elif kind in ("array", "map"):
            self.repeat(node, slot, depth + 1)
        elif kind == "record":
            children = iter(slot.children)
            for _, child in node.fields:
                self.value(child, None if is_null(child) else next(children), depth)
        else:
            raise SchemaNotExpressible(f"a {kind} value has no Iceberg type")

    def repeat(self, node: AvroNode, slot: Slot, depth: int) -> None:
        """An array or map: OP_ARRAY, the item's code, OP_NEXT."""
        self.depth = max(self.depth, depth)
        start = self.emit(ops.OP_ARRAY, slot.col, -1)
        if node.kind == "map":
            keys, value = slot.children
            self.emit(ops.OP_STRING, keys.col, keys.data, 1)
            self.value(_items(node), value, depth)
            self.emit(ops.OP_NEXT, start + 1, slot.col, keys.col, keys.data, slot.drops)
        else:
            self.value(_items(node), slot.children[0], depth)
            self.emit(ops.OP_NEXT, start + 1, slot.col, -1, -1, -1)
        self.code[start][2] = len(self.code)

    # -- pads -------------------------------------------------------------------------------

    def pad_list(self, slot: Slot) -> list[tuple[int, int, int]]:
        """What an absent value of ``slot`` appends to each of its columns."""
        out: list[tuple[int, int, int]] = []
        if slot.valid >= 0:
            out.append((ops.PAD_Z8, slot.valid, 1))
        if slot.kind == "struct":
            for child in slot.children:
                out.extend(self.pad_list(child))
        elif slot.kind in ("list", "map", "string", "binary"):
            out.append((ops.PAD_OFF, slot.col, 1))
        else:
            arena = self.arena[slot.col]
            kind = {ops.A64: ops.PAD_Z64, ops.A32: ops.PAD_Z32, ops.A8: ops.PAD_Z8}[arena]
            out.append((kind, slot.col, slot.width))
        return out

    def pad_block(self, slot: Slot) -> tuple[int, int]:
        pads = self.pad_list(slot)
        start = len(self.pads)
        self.pads.extend(pads)
        return start, len(pads)

    def nullfill(self, pads: list[tuple[int, int, int]]) -> None:
        if pads:
            start = len(self.pads)
            self.pads.extend(pads)
            self.emit(ops.OP_NULLFILL, start, len(pads))


def _items(node: AvroNode) -> AvroNode:
    assert node.items is not None
    return node.items
