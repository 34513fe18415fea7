"""Writing payloads in the encoder kernels (numba): growing the output buffer,
little-endian numbers, a UUID's lowercase 36-character text.

These functions are called from (or inlined into) the encoder kernels of every format (Avro,
JSON Schema, Protobuf). The kernels that inline these are compiled with ``cached_njit``
(:mod:`bergstream.core.kernel_cache`): their on-disk caches are keyed on this module's source
too, so changing it recompiles them.
"""

from __future__ import annotations

import numpy as np

from bergstream.core.api import cached_njit

__all__ = ["grow", "put_le", "put_uuid"]

_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


@cached_njit(nogil=True)
def grow(out: np.ndarray, used: int, need: int) -> np.ndarray:
    """``out`` with room for ``need`` bytes (its first ``used`` bytes kept)."""
    bigger = np.empty(max(2 * out.size, need), dtype=np.uint8)
    bigger[:used] = out[:used]
    return bigger


@cached_njit(nogil=True, inline="always")
def put_le(out: np.ndarray, pos: int, value: int, size: int) -> int:
    """Write the ``size`` low bytes of ``value``, little-endian, at ``pos``."""
    for i in range(size):
        out[pos + i] = (value >> (8 * i)) & 0xFF
    return pos + size


@cached_njit(nogil=True, inline="always")
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
