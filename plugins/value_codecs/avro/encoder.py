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
from bergstream.plugins.value_codecs.shared.slot import Slot

__all__ = ["AvroEncoder"]

_DTYPES = {ops.A64: np.int64, ops.A32: np.int32, ops.A8: np.uint8}
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
        arenas, base = _pack(program, columns)
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


def _pack(
    program: Program, columns: list[np.ndarray | None]
) -> tuple[list[np.ndarray], np.ndarray]:
    """The columns concatenated per arena, and each column's base in its arena."""
    base = np.zeros(len(columns), dtype=np.int64)
    parts: dict[int, list[np.ndarray]] = {arena: [] for arena in _DTYPES}
    sizes = dict.fromkeys(_DTYPES, 0)
    for col, arena in enumerate(program.col_arena):
        column = columns[col]
        if column is None:
            continue
        base[col] = sizes[int(arena)]
        sizes[int(arena)] += column.size
        parts[int(arena)].append(column)
    arenas = []
    for arena, dtype in _DTYPES.items():
        chunks = parts[arena]
        arenas.append(np.concatenate(chunks).astype(dtype, copy=False) if chunks
                      else np.zeros(1, dtype=dtype))  # fmt: skip
    return arenas, base


def _flatten(slot: Slot, array: pa.Array, columns: list[np.ndarray | None]) -> None:
    """Fill ``columns`` with the slots of ``array`` (a value array of ``slot``)."""
    length = len(array)
    valid = _bits(array.buffers()[0], array.offset, length) if array.null_count else None
    if slot.valid >= 0:
        columns[slot.valid] = valid if valid is not None else np.ones(length, dtype=np.uint8)
    kind = slot.kind
    if kind == "struct":
        for i, child in enumerate(slot.children):
            _flatten(child, array.field(i), columns)
    elif kind in ("list", "map"):
        _flatten_repeated(slot, array, valid, columns)
    elif kind in ("string", "binary"):
        buffers = array.buffers()
        offsets = _window(buffers[1], np.int64, array.offset, length + 1)
        start, stop = (int(offsets[0]), int(offsets[-1])) if length else (0, 0)
        columns[slot.col] = offsets - start
        data = buffers[2]
        columns[slot.data] = (np.frombuffer(data, dtype=np.uint8)[start:stop] if data is not None
                              else np.zeros(0, dtype=np.uint8))  # fmt: skip
    elif kind == "bool":
        columns[slot.col] = _bits(array.buffers()[1], array.offset, length)
    else:
        if isinstance(array, pa.ExtensionArray):
            array = array.storage
        dtype = _VIEWS.get(kind, np.int64 if kind == "decimal" else np.uint8)
        per_row = slot.width if kind in ("fixed", "uuid", "decimal") else 1
        columns[slot.col] = _window(array.buffers()[1], dtype, array.offset * per_row,
                                    length * per_row)  # fmt: skip


def _flatten_repeated(
    slot: Slot, array: pa.Array, valid: np.ndarray | None, columns: list[np.ndarray | None]
) -> None:
    """A list or map: offsets from 0, children sliced to the entries it uses (a null entry
    with a non-empty range, which Arrow allows, loses its elements)."""
    offsets = np.asarray(array.offsets, dtype=np.int64)
    start, stop = int(offsets[0]), int(offsets[-1])
    child = array.values.slice(start, stop - start)
    offsets = offsets - start
    if valid is not None:
        lengths = np.diff(offsets)
        used = np.where(valid != 0, lengths, 0)
        if (used != lengths).any():
            child = child.filter(pa.array(np.repeat(valid != 0, lengths)))
            offsets = np.concatenate([[0], np.cumsum(used)]).astype(np.int64)
    columns[slot.col] = offsets
    if slot.kind == "list":
        _flatten(slot.children[0], child, columns)
        return
    _flatten(slot.children[0], child.field(0), columns)
    _flatten(slot.children[1], child.field(1), columns)
    columns[slot.drops] = None


def _window(buffer: pa.Buffer | None, dtype: type, start: int, count: int) -> np.ndarray:
    if buffer is None or count == 0:
        return np.zeros(count, dtype=dtype)
    return np.frombuffer(buffer, dtype=dtype)[start : start + count]


def _bits(bitmap: pa.Buffer | None, offset: int, length: int) -> np.ndarray:
    """A bitmap as one uint8 (0 or 1) per entry; all ones when there is no bitmap."""
    if bitmap is None:
        return np.ones(length, dtype=np.uint8)
    bits = np.unpackbits(np.frombuffer(bitmap, dtype=np.uint8), bitorder="little")
    return bits[offset : offset + length]
