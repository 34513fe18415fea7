"""Vectorized Avro decoding: N payloads of one writer schema into one Arrow array.

The compiled kernel (:mod:`.decode_kernel`) appends every value to columns laid out in three
arenas (int64, int32, uint8); this module sizes the arenas (learning from earlier batches how
many slots each column takes per payload byte), grows them when the kernel runs out of room,
and turns the columns into Arrow arrays without copying them (validity and booleans are packed
into bitmaps; map offsets become int32; maps with duplicate keys lose their earlier entries).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from bergstream.core.api import DecodedValues
from bergstream.plugins.value_codecs import avro_ops as ops
from bergstream.plugins.value_codecs.avro_program import Program, Slot
from bergstream.plugins.value_codecs.decode_kernel import OVERFLOW, decode_rows
from bergstream.plugins.value_codecs.kernel_numeric import POW10

__all__ = ["AvroDecoder", "payload_buffers"]

_DTYPES = {ops.A64: np.int64, ops.A32: np.int32, ops.A8: np.uint8}
_HEADROOM = 1.25


def payload_buffers(payloads: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """The data bytes and the ``len + 1`` absolute offsets of a binary array without nulls."""
    if isinstance(payloads, pa.ChunkedArray):
        payloads = payloads.combine_chunks()
    if not pa.types.is_large_binary(payloads.type):
        payloads = payloads.cast(pa.large_binary())
    if payloads.null_count:
        raise ValueError("payloads must not be null (a tombstone has no payload to decode)")
    _, offsets_buffer, data_buffer = payloads.buffers()
    count = len(payloads)
    if offsets_buffer is None:
        offsets = np.zeros(count + 1, dtype=np.int64)
        offsets.flags.writeable = False  # the kernel is compiled for read-only inputs only
    else:
        offsets = np.frombuffer(offsets_buffer, dtype=np.int64)
        offsets = offsets[payloads.offset : payloads.offset + count + 1]
    # Read-only like the program's symbol table, so the kernel is compiled once for both.
    data = np.frombuffer(data_buffer if data_buffer is not None else b"\0", dtype=np.uint8)
    if data.size == 0:
        data = np.frombuffer(b"\0", dtype=np.uint8)
    return data, offsets


@dataclass
class _Arenas:
    """Column storage: per column its arena, base, capacity and length (in slots)."""

    arrays: list[np.ndarray]
    arena: np.ndarray
    base: np.ndarray
    cap: np.ndarray
    length: np.ndarray


class AvroDecoder:
    """Decodes payloads of one compiled schema into Arrow values of ``arrow_type``."""

    def __init__(self, program: Program, arrow_type: pa.DataType) -> None:
        self.program = program
        self.arrow_type = arrow_type
        cols = len(program.col_arena)
        self._per_byte = np.full(cols, np.nan)  # learned slots per payload byte, per column
        self._fixed = np.zeros(cols, dtype=np.int64)  # slots per row of unrepeated columns
        _slots_per_row(program.root, self._fixed)

    def decode(self, payloads: pa.Array, skip: int = 0) -> DecodedValues:
        """Decode every payload; failed rows are null with their cause. With ``skip``, each
        value's first ``skip`` bytes are a header that is not decoded (every value has it: the
        caller checked), so framed values need no copy without their framing."""
        data, offsets = payload_buffers(payloads)
        rows = len(offsets) - 1
        total = int(offsets[-1] - offsets[0]) - skip * rows if rows else 0
        arenas = self._allocate(rows, total)
        keep = np.zeros(rows, dtype=np.uint8)
        errors = np.zeros(rows, dtype=np.int8)
        program = self.program
        stack = np.zeros((program.depth + 1, 2), dtype=np.int64)
        start = 0
        while True:
            status, row, column = decode_rows(
                data, offsets, skip, start, program.code, program.jumps, program.pads,
                program.symbol_offsets, program.symbol_data, POW10,
                program.root_pads[0], program.root_pads[1], *arenas.arrays,
                arenas.base, arenas.cap, arenas.length, keep, errors, stack,
            )  # fmt: skip
            if status != OVERFLOW:
                break
            done = int(offsets[row] - offsets[0]) - skip * row
            arenas = self._grow(arenas, column, done, total)
            start = row
        if total:
            variable = self._fixed == 0
            self._per_byte[variable] = arenas.length[variable] / total
        values = _Assembler(arenas).build(program.root, self.arrow_type, rows)
        causes: list[str | None] = [None] * rows
        for row in np.flatnonzero(errors):
            causes[row] = ops.ERRORS[int(errors[row])]
        return DecodedValues(values=values, keep_bytes=keep.view(bool), errors=causes)

    def _allocate(self, rows: int, total: int) -> _Arenas:
        program = self.program
        cap = self._fixed * rows + program.col_offsets.astype(np.int64)
        guess = np.where(np.isnan(self._per_byte), 0.25, self._per_byte) * total * _HEADROOM
        cap = np.where(self._fixed == 0, guess.astype(np.int64) + 64, cap)
        return _layout(program, cap, None)

    def _grow(self, arenas: _Arenas, column: int, done: int, total: int) -> _Arenas:
        """Room for the rest of the batch: columns of unknown size get their projected need
        (from the bytes decoded so far), the one that overflowed at least twice its room."""
        cap = arenas.cap.copy()
        variable = self._fixed == 0
        if done > 0:
            projected = (arenas.length * (total / done) * _HEADROOM).astype(np.int64) + 64
            cap[variable] = np.maximum(cap[variable], projected[variable])
        cap[column] = max(int(cap[column]) * 2, int(arenas.cap[column]) + 64)
        return _layout(self.program, cap, arenas)


def _slots_per_row(slot: Slot, out: np.ndarray) -> None:
    """Slots per row of the columns outside lists and maps (0 stays for the others)."""
    if slot.valid >= 0:
        out[slot.valid] = 1
    if slot.kind == "struct":
        for child in slot.children:
            _slots_per_row(child, out)
    elif slot.kind in ("list", "map", "string", "binary"):
        out[slot.col] = 1
    else:
        out[slot.col] = slot.width


def _layout(program: Program, cap: np.ndarray, old: _Arenas | None) -> _Arenas:
    """Arenas with the given capacities; ``old`` columns copied over, or offsets columns
    started with their leading 0."""
    base = np.zeros(len(cap), dtype=np.int64)
    sizes = {arena: 0 for arena in _DTYPES}
    for col, arena in enumerate(program.col_arena):
        base[col] = sizes[int(arena)]
        sizes[int(arena)] += int(cap[col])
    arrays = [_pool_array(dtype, max(sizes[arena], 1)) for arena, dtype in _DTYPES.items()]
    if old is None:
        length = program.col_offsets.astype(np.int64)
        for col in np.flatnonzero(program.col_offsets):
            arrays[ops.A64][base[col]] = 0
    else:
        length = old.length.copy()
        for col, arena in enumerate(program.col_arena):
            n = int(length[col])
            target, source = arrays[int(arena)], old.arrays[int(arena)]
            target[base[col] : base[col] + n] = source[old.base[col] : old.base[col] + n]
    return _Arenas(arrays, program.col_arena, base, cap.astype(np.int64), length)


def _pool_array(dtype: type, count: int) -> np.ndarray:
    """An uninitialized array in a buffer of Arrow's memory pool: the pool reuses freed memory,
    where a fresh numpy allocation of this size is new pages, each faulted in on first write
    (several milliseconds per batch)."""
    buffer = pa.allocate_buffer(count * np.dtype(dtype).itemsize)
    return np.frombuffer(buffer, dtype=dtype)


class _Assembler:
    """Arrow arrays over the columns of finished arenas (no copy of values)."""

    def __init__(self, arenas: _Arenas) -> None:
        self.arenas = arenas

    def column(self, col: int, slots: int) -> np.ndarray:
        base = int(self.arenas.base[col])
        return self.arenas.arrays[int(self.arenas.arena[col])][base : base + slots]

    def build(self, slot: Slot, type_: pa.DataType, length: int) -> pa.Array:
        validity, nulls = self.validity(slot, length)
        kind = slot.kind
        if kind == "struct":
            children = [
                self.build(child, type_.field(i).type, length)
                for i, child in enumerate(slot.children)
            ]
            return pa.Array.from_buffers(type_, length, [validity], nulls, children=children)
        if kind in ("list", "map"):
            offsets = self.column(slot.col, length + 1)
            size = int(offsets[-1])
            if kind == "list":
                child = self.build(slot.children[0], type_.value_type, size)
                buffers = [validity, pa.py_buffer(offsets)]
                return pa.Array.from_buffers(type_, length, buffers, nulls, children=[child])
            return self.map(slot, type_, length, offsets, validity, nulls)
        if kind in ("string", "binary"):
            offsets = self.column(slot.col, length + 1)
            data = self.column(slot.data, int(offsets[-1]) if length else 0)
            buffers = [validity, pa.py_buffer(offsets), pa.py_buffer(data)]
            return pa.Array.from_buffers(type_, length, buffers, nulls)
        values = self.column(slot.col, length * slot.width)
        if kind == "bool":
            values = np.packbits(values, bitorder="little")
        if kind == "uuid":
            storage_type = type_.storage_type if isinstance(type_, pa.ExtensionType) else type_
            storage = pa.Array.from_buffers(
                storage_type, length, [validity, pa.py_buffer(values)], nulls
            )
            if isinstance(type_, pa.ExtensionType):
                return pa.ExtensionArray.from_storage(type_, storage)
            return storage
        return pa.Array.from_buffers(type_, length, [validity, pa.py_buffer(values)], nulls)

    def map(
        self, slot: Slot, type_: pa.MapType, length: int, offsets: np.ndarray,
        validity: pa.Buffer | None, nulls: int,
    ) -> pa.Array:  # fmt: skip
        size = int(offsets[-1])
        keys = self.build(slot.children[0], type_.key_type, size)
        items = self.build(slot.children[1], type_.item_type, size)
        entries = pa.StructArray.from_arrays(
            [keys, items], fields=[type_.key_field, type_.item_field]
        )
        dropped = self.column(slot.drops, int(self.arenas.length[slot.drops]))
        if dropped.size:
            kept = np.ones(size, dtype=bool)
            kept[dropped] = False
            entries = entries.filter(pa.array(kept))
            before = np.concatenate([[0], np.cumsum(kept)])
            offsets = before[offsets]
        buffers = [validity, pa.py_buffer(offsets.astype(np.int32))]
        return pa.Array.from_buffers(type_, length, buffers, nulls, children=[entries])

    def validity(self, slot: Slot, length: int) -> tuple[pa.Buffer | None, int]:
        if slot.valid < 0 or length == 0:
            return None, 0
        flags = self.column(slot.valid, length)
        nulls = length - int(np.count_nonzero(flags))
        if nulls == 0:
            return None, 0
        return pa.py_buffer(np.packbits(flags, bitorder="little")), nulls
