"""Column arenas of the compiled decoders (Avro, JSON Schema, Protobuf), on the Python side.

A compiled program has columns, each in one of three arenas by element type (int64, int32,
uint8; see :mod:`..avro.ops`), and a :class:`~.slot.Slot` tree saying which columns make
up which value. :class:`ArenaColumns` runs a decoder's kernel over a batch: it sizes the arenas
(learning from earlier batches how many slots each column takes per payload byte), grows them
whenever the kernel stops because a column ran out of room, and turns the finished columns into
one Arrow array without copying them (:mod:`.arena_assembly`). :func:`payload_buffers` gives a
kernel its input: the bytes and offsets of a binary array.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pyarrow as pa

from bergstream.plugins.value_codecs.shared import arena_layout as ops
from bergstream.plugins.value_codecs.shared.arena_assembly import ArrowAssembler
from bergstream.plugins.value_codecs.shared.arena_kernel import OVERFLOW
from bergstream.plugins.value_codecs.shared.slot import Slot

__all__ = [
    "ArenaColumns",
    "Arenas",
    "ColumnProgram",
    "Kernel",
    "payload_buffers",
]

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


class ColumnProgram(Protocol):
    """What arenas need to know of a compiled program."""

    col_arena: np.ndarray  # int64 per column: A64, A32 or A8
    col_offsets: np.ndarray  # bool per column: an offsets column (starts with a 0)
    root: Slot  # the columns of the top-level value


@dataclass
class Arenas:
    """Column storage: the three arenas (int64, int32, uint8) and per column its arena, base,
    capacity and length (in slots). A kernel takes ``*arrays, base, cap, length``."""

    arrays: list[np.ndarray]
    arena: np.ndarray
    base: np.ndarray
    cap: np.ndarray
    length: np.ndarray


#: A kernel run from a row over arenas: ``(status, row, column)``, the status
#: :data:`~.arena_kernel.OVERFLOW` with the row to resume at and the column that needs room.
Kernel = Callable[[int, Arenas], tuple[int, int, int]]


class ArenaColumns:
    """The arenas of one program's columns across batches, and the Arrow values of
    ``arrow_type`` they hold after a kernel ran."""

    def __init__(self, program: ColumnProgram, arrow_type: pa.DataType) -> None:
        self.program = program
        self.arrow_type = arrow_type
        cols = len(program.col_arena)
        self._per_byte = np.full(cols, np.nan)  # learned slots per payload byte, per column
        self._fixed = np.zeros(cols, dtype=np.int64)  # slots per row of unrepeated columns
        _slots_per_row(program.root, self._fixed)

    def run(self, offsets: np.ndarray, skip: int, kernel: Kernel) -> pa.Array:
        """Run ``kernel`` over the payloads at ``offsets`` (:func:`payload_buffers`; each one's
        first ``skip`` bytes are a header the kernel does not read) from row 0, growing the
        arenas and resuming each time it overflows; the Arrow array of its columns."""
        rows = len(offsets) - 1
        total = int(offsets[-1] - offsets[0]) - skip * rows if rows else 0
        arenas = self._allocate(rows, total)
        start = 0
        while True:
            status, row, column = kernel(start, arenas)
            if status != OVERFLOW:
                break
            done = int(offsets[row] - offsets[0]) - skip * row
            arenas = self._grow(arenas, column, done, total)
            start = row
        if total:
            variable = self._fixed == 0
            self._per_byte[variable] = arenas.length[variable] / total
        return ArrowAssembler(arenas).build(self.program.root, self.arrow_type, rows)

    def _allocate(self, rows: int, total: int) -> Arenas:
        program = self.program
        cap = self._fixed * rows + program.col_offsets.astype(np.int64)
        guess = np.where(np.isnan(self._per_byte), 0.25, self._per_byte) * total * _HEADROOM
        cap = np.where(self._fixed == 0, guess.astype(np.int64) + 64, cap)
        return _layout(program, cap, None)

    def _grow(self, arenas: Arenas, column: int, done: int, total: int) -> Arenas:
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
    """Set ``out[col]`` to the slots per row of the columns of ``slot`` outside lists and maps
    (0 stays for the others)."""
    if slot.valid >= 0:
        out[slot.valid] = 1
    if slot.kind == "struct":
        for child in slot.children:
            _slots_per_row(child, out)
    elif slot.kind in ("list", "map", "string", "binary"):
        out[slot.col] = 1
    else:
        out[slot.col] = slot.width


def _layout(program: ColumnProgram, cap: np.ndarray, old: Arenas | None) -> Arenas:
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
    return Arenas(arrays, program.col_arena, base, cap.astype(np.int64), length)


def _pool_array(dtype: type, count: int) -> np.ndarray:
    """An uninitialized array in a buffer of Arrow's memory pool: the pool reuses freed memory,
    where a fresh numpy allocation of this size is new pages, each faulted in on first write
    (several milliseconds per batch)."""
    buffer = pa.allocate_buffer(count * np.dtype(dtype).itemsize)
    return np.frombuffer(buffer, dtype=dtype)
