"""Compiled loops that cut the Confluent framing off payloads and put it back (numba, cached
on disk; imported lazily so importing core never compiles anything)."""

from __future__ import annotations

import numpy as np

from bergstream.core.byte_copy import copy_bytes
from bergstream.core.kernel_cache import cached_njit

__all__ = ["add_headers", "frame_ids", "strip_headers"]


@cached_njit(nogil=True)
def frame_ids(
    data: np.ndarray,
    offsets: np.ndarray,
    valid: np.ndarray,
    header: int,
    magic: int,
    framed: np.ndarray,
    ids: np.ndarray,
) -> None:  # pragma: no cover - compiled
    """Per row ``r``: whether it is framed (``valid[r]``, at least ``header`` bytes, the first
    one ``magic``) into ``framed[r]``, and the big-endian signed 32-bit schema id in the
    following bytes into ``ids[r]`` (-1 where it is not framed)."""
    for row in range(framed.shape[0]):
        start = offsets[row]
        if valid[row] and offsets[row + 1] - start >= header and data[start] == magic:
            value = np.int64(0)
            for position in range(1, header):
                value = (value << 8) | np.int64(data[start + position])
            if value >= 1 << 31:
                value -= 1 << 32
            framed[row] = True
            ids[row] = value
        else:
            framed[row] = False
            ids[row] = -1


@cached_njit(nogil=True)
def strip_headers(
    data: np.ndarray,
    offsets: np.ndarray,
    rows: np.ndarray,
    header: int,
    out: np.ndarray,
    out_offsets: np.ndarray,
) -> None:  # pragma: no cover - compiled
    """Copy ``data[offsets[r] + header : offsets[r + 1]]`` of each row ``r`` in ``rows`` into
    ``out``, one after the other, writing their offsets to ``out_offsets``."""
    position = 0
    out_offsets[0] = 0
    for index in range(rows.shape[0]):
        row = rows[index]
        start = offsets[row] + header
        end = offsets[row + 1]
        length = end - start
        copy_bytes(out, position, data, start, length)
        position += length
        out_offsets[index + 1] = position


@cached_njit(nogil=True)
def add_headers(
    data: np.ndarray,
    offsets: np.ndarray,
    header_bytes: np.ndarray,
    out: np.ndarray,
    out_offsets: np.ndarray,
) -> None:  # pragma: no cover - compiled
    """Write ``header_bytes`` then each value of ``data``/``offsets`` into ``out``."""
    header = header_bytes.shape[0]
    position = 0
    out_offsets[0] = 0
    for row in range(offsets.shape[0] - 1):
        out[position : position + header] = header_bytes
        position += header
        length = offsets[row + 1] - offsets[row]
        copy_bytes(out, position, data, offsets[row], length)
        position += length
        out_offsets[row + 1] = position
