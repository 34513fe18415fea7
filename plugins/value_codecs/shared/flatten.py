"""Arrow arrays back into the flat columns the encoder kernels read (Avro, JSON Schema,
Protobuf): validity and boolean bitmaps as one byte per entry, fixed-width values and string
offsets as windows on their buffers (no copy), and the columns packed into the three arenas.

Every function honours the array's offset, so a sliced array gives the columns of its own
entries only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa

from bergstream.plugins.value_codecs.shared.arena_layout import A8, A32, A64

__all__ = ["ARENA_DTYPES", "bits", "entries", "pack", "strings", "window"]

#: The element type of each arena.
ARENA_DTYPES: dict[int, type] = {A64: np.int64, A32: np.int32, A8: np.uint8}


def bits(bitmap: pa.Buffer | None, offset: int, length: int) -> np.ndarray:
    """A bitmap as one uint8 (0 or 1) per entry of ``[offset, offset + length)``; all ones when
    there is no bitmap. Only the bytes holding those entries are unpacked."""
    if bitmap is None:
        return np.ones(length, dtype=np.uint8)
    first = offset // 8
    last = (offset + length + 7) // 8
    unpacked = np.unpackbits(np.frombuffer(bitmap, dtype=np.uint8)[first:last], bitorder="little")
    return unpacked[offset - 8 * first : offset - 8 * first + length]


def window(buffer: pa.Buffer | None, dtype: type, start: int, count: int) -> np.ndarray:
    """``count`` values of ``dtype`` from value ``start`` of ``buffer`` (zeros when there is no
    buffer or nothing to read), a view without copying."""
    if buffer is None or count == 0:
        return np.zeros(count, dtype=dtype)
    return np.frombuffer(buffer, dtype=dtype)[start : start + count]


def strings(array: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """The offsets (from 0) and the bytes of a ``large_string`` or ``large_binary`` array:
    exactly its entries' bytes, whatever its offset."""
    length = len(array)
    if not length:
        return np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.uint8)
    buffers = array.buffers()
    offsets = window(buffers[1], np.int64, array.offset, length + 1)
    start, stop = int(offsets[0]), int(offsets[-1])
    data = buffers[2]
    values = (
        np.frombuffer(data, dtype=np.uint8)[start:stop]
        if data is not None
        else np.zeros(0, dtype=np.uint8)
    )
    return offsets - start, values


def entries(array: pa.Array, valid: np.ndarray | None) -> tuple[np.ndarray, pa.Array]:
    """The offsets (from 0) of a list or map array and its child array sliced to the entries it
    uses; where ``valid`` (one byte per entry, None: all valid) says an entry is null, its
    elements are dropped (Arrow allows a null entry a non-empty range)."""
    offsets = np.asarray(array.offsets, dtype=np.int64)
    start, stop = int(offsets[0]), int(offsets[-1])
    child = array.values.slice(start, stop - start)
    offsets = offsets - start
    if valid is not None:
        keep = valid != 0
        lengths = np.diff(offsets)
        used = np.where(keep, lengths, 0)
        if (used != lengths).any():
            child = child.filter(pa.array(np.repeat(keep, lengths)))
            offsets = np.concatenate([[0], np.cumsum(used)]).astype(np.int64)
    return offsets, child


def pack(
    col_arena: Sequence[int],
    columns: Sequence[np.ndarray | None],
    allocate: Callable[[int, type], np.ndarray] | None = None,
) -> tuple[list[np.ndarray], np.ndarray]:
    """The columns concatenated per arena (in :data:`ARENA_DTYPES` order; one zero where an
    arena has none), and each column's base in its arena. ``allocate(count, dtype)`` gives the
    uninitialized array an arena is concatenated into (default: numpy's)."""
    base = np.zeros(max(len(columns), 1), dtype=np.int64)
    parts: dict[int, list[np.ndarray]] = {arena: [] for arena in ARENA_DTYPES}
    sizes = dict.fromkeys(ARENA_DTYPES, 0)
    for col, arena in enumerate(col_arena):
        column = columns[col]
        if column is None:
            continue
        base[col] = sizes[int(arena)]
        sizes[int(arena)] += column.size
        parts[int(arena)].append(column)
    arenas = []
    for arena, dtype in ARENA_DTYPES.items():
        chunks = parts[arena]
        if not chunks:
            arenas.append(np.zeros(1, dtype=dtype))
        elif allocate is None:
            arenas.append(np.concatenate(chunks).astype(dtype, copy=False))
        else:
            packed = allocate(sizes[arena], dtype)
            np.concatenate(chunks, out=packed, casting="unsafe")
            arenas.append(packed)
    return arenas, base
