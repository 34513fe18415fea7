"""What the compiled decoders' kernels (numba) share about column arenas: the status a walk over
a batch ends with, and appending to columns: the slots of absent values (the pad table of
:mod:`.arena_layout`: kind, column, slot count per row), a validity byte, an int64, a list's end
offset, a string (its bytes in a data column, its end offset in an offsets column).

Every append returns -1, or the column that ran out of room (nothing appended then): the
kernels stop the row there (status :data:`OVERFLOW`).

The helpers are compiled without reference counting (``_nrt=False``: they allocate nothing)
and are not inlined by numba: LLVM inlines them. Inlined by numba (``inline="always"``), each
array they take costs a reference count update per call in the kernel's loop (measured: the
Avro decoder 60% slower).

These functions are called from the decoder kernels of every format (Avro, JSON Schema,
Protobuf), and the statuses are frozen into them. The kernels that inline these are compiled
with ``cached_njit`` (:mod:`bergstream.core.kernel_cache`): their on-disk caches are keyed on
this module's source too, so changing it recompiles them."""

from __future__ import annotations

import numpy as np

from bergstream.core.api import cached_njit, copy_bytes
from bergstream.plugins.value_codecs.shared.arena_layout import (
    PAD_OFF,
    PAD_SYM,
    PAD_Z8,
    PAD_Z32,
    PAD_Z64,
)

__all__ = [
    "DONE",
    "OVERFLOW",
    "append_long",
    "append_offset",
    "append_pads",
    "append_string",
    "append_valid",
    "copy_lengths",
    "end_row",
    "end_string",
    "null_row",
    "string_room",
]

#: The kernel walked every row.
DONE = 0
#: A column ran out of room: the kernel stopped before a row (nothing of it kept), so the caller
#: grows the arenas and resumes there.
OVERFLOW = 1


@cached_njit(nogil=True, _nrt=False)
def append_valid(a8: np.ndarray, cbase: np.ndarray, ccap: np.ndarray, clen: np.ndarray,
                 col: int) -> int:  # fmt: skip
    """Append a 1 (the value is there) to the uint8 column ``col`` (base ``cbase``, capacity
    ``ccap``, length ``clen`` in slots); -1, or ``col`` if it has no room."""
    at = clen[col]
    if at >= ccap[col]:
        return col
    a8[cbase[col] + at] = 1
    clen[col] = at + 1
    return -1


@cached_njit(nogil=True, _nrt=False)
def append_long(a64: np.ndarray, cbase: np.ndarray, ccap: np.ndarray, clen: np.ndarray,
                col: int, value: int) -> int:  # fmt: skip
    """Append ``value`` to the int64 column ``col``; -1, or ``col`` if it has no room."""
    at = clen[col]
    if at >= ccap[col]:
        return col
    a64[cbase[col] + at] = value
    clen[col] = at + 1
    return -1


@cached_njit(nogil=True, _nrt=False)
def append_offset(a64: np.ndarray, cbase: np.ndarray, ccap: np.ndarray, clen: np.ndarray,
                  col: int, count: int) -> int:  # fmt: skip
    """Append to the offsets column ``col`` the end of a list of ``count`` items (its last
    offset plus ``count``); -1, or ``col`` if it has no room."""
    at = clen[col]
    if at >= ccap[col]:
        return col
    where = cbase[col] + at
    a64[where] = a64[where - 1] + count
    clen[col] = at + 1
    return -1


@cached_njit(nogil=True, _nrt=False)
def string_room(ccap: np.ndarray, clen: np.ndarray, col: int, data: int, length: int) -> int:
    """-1 if a string of ``length`` bytes fits (its bytes in the uint8 column ``data``, its end
    offset in the offsets column ``col``), else the column that has no room (``data`` first)."""
    if clen[data] + length > ccap[data]:
        return data
    if clen[col] >= ccap[col]:
        return col
    return -1


@cached_njit(nogil=True, _nrt=False)
def end_string(a64: np.ndarray, cbase: np.ndarray, clen: np.ndarray, col: int, data: int,
               length: int) -> None:  # fmt: skip
    """Keep the ``length`` bytes written after the end of column ``data`` (room checked with
    :func:`string_room`) as one more string: its end offset appended to ``col``."""
    filled = clen[data] + length
    clen[data] = filled
    at = clen[col]
    a64[cbase[col] + at] = filled
    clen[col] = at + 1


@cached_njit(nogil=True, _nrt=False)
def append_string(
    a64: np.ndarray, a8: np.ndarray, cbase: np.ndarray, ccap: np.ndarray, clen: np.ndarray,
    col: int, data: int, source: np.ndarray, start: int, length: int,
) -> int:  # fmt: skip
    """Append the string ``source[start : start + length]`` (its bytes to the uint8 column
    ``data``, its end offset to the offsets column ``col``); -1, or the column that has no
    room (``data`` first)."""
    over = string_room(ccap, clen, col, data, length)
    if over < 0:
        copy_bytes(a8, cbase[data] + clen[data], source, start, length)
        end_string(a64, cbase, clen, col, data, length)
    return over


@cached_njit(nogil=True)
def append_pads(
    pads: np.ndarray, first: int, count: int, symbol_offsets: np.ndarray,
    symbol_data: np.ndarray, a64: np.ndarray, a32: np.ndarray, a8: np.ndarray,
    cbase: np.ndarray, ccap: np.ndarray, clen: np.ndarray,
) -> int:  # fmt: skip
    """Append the slots of absent values (pads ``first .. first + count - 1``) to their columns;
    -1, or the column that ran out of room. A :data:`PAD_SYM` pad's symbol is read from
    ``symbol_offsets`` and ``symbol_data`` (empty arrays where there is none)."""
    for i in range(first, first + count):
        kind = pads[i, 0]
        col = pads[i, 1]
        if kind == PAD_SYM:
            start = symbol_offsets[pads[i, 3]]
            length = symbol_offsets[pads[i, 3] + 1] - start
            over = append_string(
                a64, a8, cbase, ccap, clen, col, pads[i, 2], symbol_data, start, length
            )
            if over >= 0:
                return over
            continue
        slots = pads[i, 2]
        at = clen[col]
        if at + slots > ccap[col]:
            return col
        where = cbase[col] + at
        if kind == PAD_OFF:
            a64[where] = a64[where - 1]
        elif kind == PAD_Z64:
            for s in range(slots):
                a64[where + s] = 0
        elif kind == PAD_Z32:
            a32[where] = 0
        elif kind == PAD_Z8:
            for s in range(slots):
                a8[where + s] = 0
        clen[col] = at + slots
    return -1


@cached_njit(nogil=True, _nrt=False)
def copy_lengths(source: np.ndarray, target: np.ndarray) -> None:
    """``target[:] = source``: the column lengths at a row's start saved, or restored to roll the
    row back."""
    for c in range(source.size):
        target[c] = source[c]


@cached_njit(nogil=True)
def null_row(
    saved: np.ndarray, pads: np.ndarray, first: int, count: int, symbol_offsets: np.ndarray,
    symbol_data: np.ndarray, a64: np.ndarray, a32: np.ndarray, a8: np.ndarray,
    cbase: np.ndarray, ccap: np.ndarray, clen: np.ndarray,
) -> int:  # fmt: skip
    """Roll a row's columns back to their lengths ``saved`` at its start and append the pads of a
    null row (``first``, ``count``: see :func:`append_pads`); -1, or the column that ran out of
    room."""
    copy_lengths(saved, clen)
    return append_pads(
        pads, first, count, symbol_offsets, symbol_data, a64, a32, a8, cbase, ccap, clen
    )


@cached_njit(nogil=True)
def end_row(
    over: int, failed: bool, saved: np.ndarray, pads: np.ndarray, first: int, count: int,
    symbol_offsets: np.ndarray, symbol_data: np.ndarray, a64: np.ndarray, a32: np.ndarray,
    a8: np.ndarray, cbase: np.ndarray, ccap: np.ndarray, clen: np.ndarray,
) -> int:  # fmt: skip
    """End the row a decoder kernel walked, whose walk stopped with ``over`` (a column that ran
    out of room, or negative): -1 when the row is done, kept as walked or (``failed``) rolled
    back to ``saved`` and filled with the null row (``first``, ``count``: see
    :func:`append_pads`); else the column that ran out of room, the row rolled back (the kernel
    stops there with :data:`OVERFLOW`)."""
    if over >= 0:
        copy_lengths(saved, clen)
        return over
    if not failed:
        return -1
    return null_row(
        saved, pads, first, count, symbol_offsets, symbol_data, a64, a32, a8, cbase, ccap, clen
    )
