"""Vectorized Avro encoding: an Arrow array of decoded values back to canonical payloads.

The value array is flattened into the columns of the schema's program (the same numbering the
decoder writes), packed into three arenas, and the compiled kernel (:mod:`.encode_kernel`)
writes one payload per row into a ``large_binary`` array.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from bergstream.plugins.value_codecs.avro import ops
from bergstream.plugins.value_codecs.avro.encode_kernel import encode_rows
from bergstream.plugins.value_codecs.avro.program import Program
from bergstream.plugins.value_codecs.shared.flatten import bits, entries, pack, strings, window
from bergstream.plugins.value_codecs.shared.slot import Slot

__all__ = ["AvroEncoder"]

_VIEWS = {"int32": np.int32, "float32": np.int32, "int64": np.int64, "float64": np.int64}


class AvroEncoder:
    """Encodes Arrow values of ``arrow_type`` with one compiled schema."""

    def __init__(self, program: Program, arrow_type: pa.DataType) -> None:
        self.program = program
        self.arrow_type = arrow_type

    def encode(self, values: pa.Array) -> pa.Array:
        """One canonical payload per row. ``values`` has no null rows, unless the schema is a
        union with null (a null row is then the null branch). Raises ValueError for values no
        Avro datum of the schema decodes to."""
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        if values.type != self.arrow_type:
            values = values.cast(self.arrow_type)
        if values.null_count and not self.program.root_nullable:
            raise ValueError("values to encode must not be null (the schema is not nullable)")
        rows = len(values)
        program = self.program
        columns: list[np.ndarray | None] = [None] * len(program.col_arena)
        _flatten(program.root, values, columns)
        arenas, base = pack(program.col_arena, columns)
        out = np.empty(max(64, sum(a.nbytes for a in arenas) + 4 * rows), dtype=np.uint8)
        offsets = np.empty(rows + 1, dtype=np.int64)
        stack = np.zeros((program.depth + 1, 1), dtype=np.int64)
        status, row, out = encode_rows(
            rows, program.code, program.jumps, program.selectors, program.pads,
            program.symbol_offsets, program.symbol_data, *arenas, base, stack, out, offsets,
        )  # fmt: skip
        if status:
            raise ValueError(f"row {row} cannot be encoded: {ops.ENCODE_ERRORS[status]}")
        size = int(offsets[rows])
        buffers = [None, pa.py_buffer(offsets), pa.py_buffer(out[:size])]
        return pa.Array.from_buffers(pa.large_binary(), rows, buffers)


def _flatten(slot: Slot, array: pa.Array, columns: list[np.ndarray | None]) -> None:
    """Fill ``columns`` with the slots of ``array`` (a value array of ``slot``)."""
    length = len(array)
    valid = bits(array.buffers()[0], array.offset, length) if array.null_count else None
    if slot.valid >= 0:
        columns[slot.valid] = valid if valid is not None else np.ones(length, dtype=np.uint8)
    kind = slot.kind
    if kind == "struct":
        for i, child in enumerate(slot.children):
            _flatten(child, array.field(i), columns)
    elif kind in ("list", "map"):
        _flatten_repeated(slot, array, valid, columns)
    elif kind in ("string", "binary"):
        columns[slot.col], columns[slot.data] = strings(array)
    elif kind == "bool":
        columns[slot.col] = bits(array.buffers()[1], array.offset, length)
    else:
        if isinstance(array, pa.ExtensionArray):
            array = array.storage
        dtype = _VIEWS.get(kind, np.int64 if kind == "decimal" else np.uint8)
        per_row = slot.width if kind in ("fixed", "uuid", "decimal") else 1
        columns[slot.col] = window(array.buffers()[1], dtype, array.offset * per_row,
                                    length * per_row)  # fmt: skip


def _flatten_repeated(
    slot: Slot, array: pa.Array, valid: np.ndarray | None, columns: list[np.ndarray | None]
) -> None:
    """A list or map: offsets from 0, children sliced to the entries it uses (a null entry
    with a non-empty range, which Arrow allows, loses its elements)."""
    columns[slot.col], child = entries(array, valid)
    if slot.kind == "list":
        _flatten(slot.children[0], child, columns)
        return
    _flatten(slot.children[0], child.field(0), columns)
    _flatten(slot.children[1], child.field(1), columns)
    columns[slot.drops] = None
