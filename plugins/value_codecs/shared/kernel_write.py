"""Writing payloads in the encoder kernels (numba): growing the output buffer, varints,
little-endian numbers, a UUID's lowercase 36-character text.

These functions are called from (or inlined into) :func:`..avro.encode_kernel.encode_rows`,
:func:`..protobuf.encode_kernel.encode_rows` and :func:`..json_schema.encode_kernel.write_rows`, whose
on-disk numba caches are keyed on their own files only: after changing this module, touch those
three files too so they are recompiled.
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["grow", "put_le", "put_uuid", "put_varint", "put_zigzag"]

_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


@numba.njit(cache=True, nogil=True)
def grow(out: np.ndarray, used: int, need: int) -> np.ndarray:
    """``out`` with room for ``need`` bytes (its first ``used`` bytes kept)."""
    bigger = np.empty(max(2 * out.size, need), dtype=np.uint8)
    bigger[:used] = out[:used]
    return bigger


@numba.njit(cache=True, nogil=True, inline="always")
def put_varint(out: np.ndarray, pos: int, value: int) -> int:
    """Write the unsigned varint of ``value``'s 64 bits at ``pos`` (room checked by the
    caller): 10 bytes for a negative value."""
    while value & ~np.int64(0x7F) != 0:
        out[pos] = (value & 0x7F) | 0x80
        value = (value >> 7) & 0x01FFFFFFFFFFFFFF
        pos += 1
    out[pos] = value
    return pos + 1


@numba.njit(cache=True, nogil=True, inline="always")
def put_zigzag(out: np.ndarray, pos: int, value: int) -> int:
    """Write ``value`` zigzag-encoded at ``pos`` (room for 10 bytes checked by the caller)."""
    return put_varint(out, pos, (value << 1) ^ (value >> 63))


@numba.njit(cache=True, nogil=True, inline="always")
def put_le(out: np.ndarray, pos: int, value: int, size: int) -> int:
    """Write the ``size`` low bytes of ``value``, little-endian, at ``pos``."""
    for i in range(size):
        out[pos + i] = (value >> (8 * i)) & 0xFF
    return pos + size


@numba.njit(cache=True, nogil=True, inline="always")
def put_uuid(out: np.ndarray, pos: int, a8: np.ndarray, at: int) -> int:
    """Write the 16 bytes ``a8[at : at + 16]`` as a UUID's lowercase text (36 bytes, no
    quotes) at ``pos`` (room checked by the caller); the position after it."""
    for i in range(16):
        if i == 4 or i == 6 or i == 8 or i == 10:
            out[pos] = 45
            pos += 1
        out[pos] = _HEX[a8[at + i] >> 4]
        out[pos + 1] = _HEX[a8[at + i] & 15]
        pos += 2
    return pos
