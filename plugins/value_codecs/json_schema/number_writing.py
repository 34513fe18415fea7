"""Numbers written by the JSON encode kernel (numba): int64 integers, and doubles spelled as
Python's ``repr`` spells them (the shortest digits that read back as the double, the nearest
of them when several are as short, ties to even; then ``repr``'s layout).

The digits of a normal double come from the Schubfach method (R. Giulietti, "The Schubfach way
to render doubles", 2020): with ``v = c * 2**q`` and ``k = floor(log10(2**q))`` (of ``3/4 *
2**q`` when ``c`` is a power of two, whose lower neighbour is nearer), ``floor(v * 10**-k)``
and the bounds of ``v``'s rounding interval are computed in 64-bit words from a 126-bit
approximation of ``10**-k`` (round-to-odd products keep comparisons exact); the decimals of one
digit less (a multiple of ten) and of the full length around ``v`` are then tested against the
interval. A double whose digits are an integer below ``2**53`` is written directly. Subnormal
doubles are not written here: :func:`write_double` returns -1 and the caller writes them the
slow way.

Why written here (``bench/json_number_writing.py``, one million doubles, same run): the kernel
writes them in 165 ms, ``repr`` per value takes 2,100 ms (12.7x); ``orjson.dumps`` of the list
takes 92 ms (0.6x) but spells some doubles otherwise (``1e-05`` is ``0.00001`` there), so its
bytes are not the canonical ones the decoder proved, and neither library can be called from the
compiled row loop, which would have to hand every row back to Python.

Inlined into :mod:`.encode_kernel`. The kernels that inline these are compiled with ``cached_njit``
(:mod:`bergstream.core.kernel_cache`): their on-disk caches are keyed on this module's source
too, so changing it recompiles them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from llvmlite import ir
from numba.core import types
from numba.core.base import BaseContext
from numba.core.typing.templates import Signature
from numba.extending import intrinsic

from bergstream.core.api import cached_njit

__all__ = ["G_K_MIN", "g_table", "write_double", "write_long"]

_U63 = np.uint64(63)
_M63 = np.uint64((1 << 63) - 1)
_U1 = np.uint64(1)

_P = 53
_Q_MIN = -1074
_C_MIN = 1 << (_P - 1)
_MANTISSA = (1 << (_P - 1)) - 1
#: Smallest and largest k of the table (one more each way than doubles need).
G_K_MIN = -325
G_K_MAX = 293


def _floor_log2(num: int, den: int) -> int:
    """``floor(log2(num / den))`` for positive integers."""
    e = num.bit_length() - den.bit_length()
    while (num << max(-e, 0)) < (den << max(e, 0)):
        e -= 1
    while (num << max(-e - 1, 0)) >= (den << max(e + 1, 0)):
        e += 1
    return e


def g_table() -> tuple[np.ndarray, np.ndarray]:
    """For each k from :data:`G_K_MIN` to :data:`G_K_MAX`: ``g = floor(10**-k * 2**-r) + 1``
    with ``r`` such that ``2**125 <= g - 1 < 2**126``, split as ``g1 * 2**63 + g0``."""
    g1 = np.zeros(G_K_MAX - G_K_MIN + 1, dtype=np.uint64)
    g0 = np.zeros_like(g1)
    for k in range(G_K_MIN, G_K_MAX + 1):
        num, den = (10**-k, 1) if k <= 0 else (1, 10**k)
        r = _floor_log2(num, den) - 125
        g = (num << max(-r, 0)) // (den << max(r, 0)) + 1
        g1[k - G_K_MIN] = g >> 63
        g0[k - G_K_MIN] = g & ((1 << 63) - 1)
    return g1, g0


_G1, _G0 = g_table()
_PAIRS = np.frombuffer("".join(f"{i:02d}" for i in range(100)).encode(), dtype=np.uint8)
_POW10 = np.array([10**i for i in range(19)], dtype=np.int64)
_U10 = np.uint64(10)
_U100 = np.uint64(100)
_NAN = np.frombuffer(b"NaN", dtype=np.uint8)
_INFINITY = np.frombuffer(b"Infinity", dtype=np.uint8)


@intrinsic
def _mul_high(
    typingctx: object, a: types.Type, b: types.Type
) -> tuple[Signature, Callable[..., object]]:
    """The high 64 bits of the 128-bit product of two uint64 (one machine multiply)."""

    def codegen(
        context: BaseContext, builder: ir.IRBuilder, signature: Signature, args: list[ir.Value]
    ) -> ir.Value:
        wide = ir.IntType(128)
        product = builder.mul(builder.zext(args[0], wide), builder.zext(args[1], wide))
        return builder.trunc(builder.lshr(product, ir.Constant(wide, 64)), ir.IntType(64))

    return types.uint64(types.uint64, types.uint64), codegen


@cached_njit(nogil=True, inline="always")
def _rop(g1: np.uint64, g0: np.uint64, cp: np.uint64) -> int:
    """``g * cp / 2**127`` rounded to odd (g = g1 * 2**63 + g0)."""
    x1 = _mul_high(g0, cp)
    y0 = g1 * cp
    y1 = _mul_high(g1, cp)
    z = (y0 >> _U1) + x1
    vbp = y1 + (z >> _U63)
    return np.int64(vbp | (((z & _M63) + _M63) >> _U63))


@cached_njit(nogil=True, inline="always")
def _flog10pow2(q: int) -> int:
    """``floor(q * log10(2))`` for |q| <= 5000 (checked against exact values in the tests)."""
    return (q * 661_971_961_083) >> 41


@cached_njit(nogil=True, inline="always")
def _flog10_three_quarters_pow2(q: int) -> int:
    """``floor(log10(3/4 * 2**q))`` for |q| <= 5000."""
    return (q * 661_971_961_083 - 274_743_187_321) >> 41


@cached_njit(nogil=True, inline="always")
def _flog2pow10(e: int) -> int:
    """``floor(e * log2(10))`` for |e| <= 1500."""
    return (e * 913_124_641_741) >> 38


@cached_njit(nogil=True)
def _digits(c: int, q: int) -> tuple[int, int]:
    """The shortest decimal ``f * 10**e`` of the normal double ``c * 2**q`` (nearest, ties
    to even): (f, e); ``f`` may end with zeros."""
    if -_P < q < 0:
        f = c >> -q
        if f << -q == c:  # an integer below 2**53: its own shortest decimal
            return f, 0
    out = c & 1
    cb = c << 2
    cbr = cb + 2
    if c != _C_MIN or q == _Q_MIN:
        cbl = cb - 2
        k = _flog10pow2(q)
    else:  # the lower neighbour is nearer: the interval is lopsided
        cbl = cb - 1
        k = _flog10_three_quarters_pow2(q)
    h = q + _flog2pow10(-k) + 2
    g1 = _G1[k - G_K_MIN]
    g0 = _G0[k - G_K_MIN]
    vb = _rop(g1, g0, np.uint64(cb << h))
    vbl = _rop(g1, g0, np.uint64(cbl << h))
    vbr = _rop(g1, g0, np.uint64(cbr << h))
    s = vb >> 2
    sp10 = 10 * (s // 10)
    tp10 = sp10 + 10
    upin = vbl + out <= sp10 << 2
    wpin = (tp10 << 2) + out <= vbr
    if upin != wpin:
        return (sp10 if upin else tp10), k
    t = s + 1
    uin = vbl + out <= s << 2
    win = (t << 2) + out <= vbr
    if uin != win:
        return (s if uin else t), k
    cmp = vb - ((s + t) << 1)
    return (s if cmp < 0 or (cmp == 0 and (s & 1) == 0) else t), k


@cached_njit(nogil=True, inline="always")
def _put_uint(out: np.ndarray, pos: int, value: int, count: int) -> int:
    """Write the ``count`` decimal digits of ``value`` (>= 0, zero-padded) at ``pos``."""
    rest = np.uint64(value)
    at = pos + count
    while at - pos >= 2:
        pair = rest % _U100
        rest //= _U100
        at -= 2
        out[at] = _PAIRS[2 * pair]
        out[at + 1] = _PAIRS[2 * pair + 1]
    if at > pos:
        out[pos] = 48 + rest % _U10
    return pos + count


@cached_njit(nogil=True, inline="always")
def _put_bytes(out: np.ndarray, pos: int, text: np.ndarray) -> int:
    for i in range(text.size):
        out[pos + i] = text[i]
    return pos + text.size


@cached_njit(nogil=True, inline="always")
def _count_digits(value: int) -> int:
    """The decimal digits of ``value`` (>= 0)."""
    n = 1
    while n < 19 and value >= _POW10[n]:
        n += 1
    return n


@cached_njit(nogil=True)
def write_long(out: np.ndarray, pos: int, value: int) -> int:
    """Write an int64 in decimal at ``pos`` (20 bytes of room); the position after it."""
    if value < 0:
        out[pos] = 45
        pos += 1
        if value == -9223372036854775807 - 1:  # its negation does not fit
            return _put_uint(out, _put_uint(out, pos, 922337203, 9), 6854775808, 10)
        value = -value
    return _put_uint(out, pos, value, _count_digits(value))


@cached_njit(nogil=True)
def write_double(out: np.ndarray, pos: int, bits: int) -> int:
    """Write the double of raw ``bits`` as ``repr`` does (``NaN``, ``Infinity`` and
    ``-Infinity`` as the json module writes them) at ``pos`` (24 bytes of room); the position
    after it, or -1 for a subnormal double."""
    negative = bits < 0
    biased = (bits >> 52) & 0x7FF
    mantissa = bits & _MANTISSA
    if biased == 0x7FF:
        if mantissa != 0:
            return _put_bytes(out, pos, _NAN)
        if negative:
            out[pos] = 45
            pos += 1
        return _put_bytes(out, pos, _INFINITY)
    if negative:
        out[pos] = 45
        pos += 1
    if biased == 0:
        if mantissa != 0:
            return -1
        out[pos] = 48
        out[pos + 1] = 46
        out[pos + 2] = 48
        return pos + 3
    f, e = _digits(mantissa | _C_MIN, biased - 1075)
    while f % 100 == 0:
        f //= 100
        e += 2
    if f % 10 == 0:
        f //= 10
        e += 1
    n = _count_digits(f)
    point = n + e  # the value is 0.DIGITS * 10**point
    if point <= -4 or point > 16:  # d[.ddd]e+XX: the digits written one to the right
        _put_uint(out, pos + 1, f, n)
        out[pos] = out[pos + 1]
        if n > 1:
            out[pos + 1] = 46
            pos += n + 1
        else:
            pos += 1
        out[pos] = 101
        exponent = point - 1
        out[pos + 1] = 45 if exponent < 0 else 43
        exponent = abs(exponent)
        return _put_uint(out, pos + 2, exponent, 3 if exponent >= 100 else 2)
    if point <= 0:
        out[pos] = 48
        out[pos + 1] = 46
        pos += 2
        for _ in range(-point):
            out[pos] = 48
            pos += 1
        return _put_uint(out, pos, f, n)
    if point >= n:
        pos = _put_uint(out, pos, f, n)
        for _ in range(point - n):
            out[pos] = 48
            pos += 1
        out[pos] = 46
        out[pos + 1] = 48
        return pos + 2
    _put_uint(out, pos, f, n)  # then the fraction's digits move right for the point
    for i in range(pos + n, pos + point, -1):
        out[i] = out[i - 1]
    out[pos + point] = 46
    return pos + n + 1
