"""128-bit decimal arithmetic for the kernels, on (high, low) pairs of int64 (numba has no
int128): magnitudes, unsigned comparisons, precision bounds and canonical byte lengths.

Inlined into the Avro decoder and encoder kernels. The kernels that inline these are compiled
with ``cached_njit`` (:mod:`bergstream.core.kernel_cache`): their on-disk caches are keyed on
this module's source too, so changing it recompiles them."""

from __future__ import annotations

import numpy as np

from bergstream.core.api import cached_njit

__all__ = ["POW10", "decimal_length", "fits_precision", "magnitude"]

_MASK64 = (1 << 64) - 1


def _pair(value: int) -> tuple[int, int]:
    """(high, low) int64 words of a non-negative int below 2**127."""
    low = value & _MASK64
    high = value >> 64
    return high, low - (1 << 64) if low >= 1 << 63 else low


#: 10**p as (high, low) int64 words, p = 0..38.
POW10 = np.array([_pair(10**p) for p in range(39)], dtype=np.int64)

_SIGN = np.int64(-9223372036854775808)


@cached_njit(nogil=True, inline="always")
def _ult(a: int, b: int) -> bool:
    """``a < b`` with both read as unsigned 64-bit words."""
    return (a ^ _SIGN) < (b ^ _SIGN)


@cached_njit(nogil=True, inline="always")
def magnitude(high: int, low: int) -> tuple[int, int]:
    """The absolute value of a 128-bit two's complement number (high word < 0 only for
    -2**127, whose magnitude does not fit)."""
    if high >= 0:
        return high, low
    low = ~low + 1
    high = ~high + (1 if low == 0 else 0)
    return high, low


@cached_njit(nogil=True, inline="always")
def fits_precision(high: int, low: int, precision: int, pow10: np.ndarray) -> bool:
    """Whether the 128-bit value has at most ``precision`` decimal digits."""
    mhigh, mlow = magnitude(high, low)
    if mhigh < 0:
        return False
    phigh = pow10[precision, 0]
    if mhigh != phigh:
        return mhigh < phigh
    return _ult(mlow, pow10[precision, 1])


@cached_njit(nogil=True, inline="always")
def _bit_length(word: int) -> int:
    """Bits needed for a word read as unsigned."""
    if word < 0:
        return 64
    n = 0
    while word >= 256:
        word >>= 8
        n += 8
    while word > 0:
        word >>= 1
        n += 1
    return n


@cached_njit(nogil=True, inline="always")
def decimal_length(high: int, low: int) -> int:
    """Bytes of the canonical Avro ``bytes`` decimal of a 128-bit value: fastavro's (and
    confluent-kafka's) ``(abs(v).bit_length() + 8) // 8``, which equals the minimal two's
    complement length except for -2**(8k-1), written with one more byte."""
    mhigh, mlow = magnitude(high, low)
    bits = 64 + _bit_length(mhigh) if mhigh != 0 else _bit_length(mlow)
    return (bits + 8) // 8
