"""Numbers of canonical JSON in the JSON kernel (numba): int64 integers and doubles spelled as
Python's ``repr`` spells them.

A double's text is canonical when it is ``repr`` of the float it reads as: the shortest digit
string that reads back as that float (the nearest one when several are as short), laid out as
``repr`` lays it out. :func:`read_double` proves that without formatting the float:

- a text of at most 15 significant digits is canonical when its layout is and it reads as a
  normal float: two different decimals of at most 15 digits never read as the same normal
  float (``DBL_DIG``), so ``repr``, which has at most as many digits, is that same decimal;
- a longer one (16 or 17 digits, ``M * 10**q``) is read exactly (an approximation corrected by
  exact comparisons with the midpoints between floats) and is canonical when the two decimals
  of one digit less around the float both lie outside its rounding interval (no shorter text
  reads as it) and the float is nearer to it than half a unit of its last digit (no other text
  of its length is nearer).

Exact comparisons of ``D * 10**p`` with ``b * 2**f`` use 128-bit integers (two uint64 words);
when they would need more (very large or small exponents), or on an exact tie, the answer is
"not proven" and the row goes the slow way: a False is never wrong, only slower.

Why not orjson or the standard library: they read a number but cannot prove its text canonical
inside the compiled row loop; outside it, parsing and comparing ``repr`` costs more.
``bench/json_numbers.py`` (300k doubles, half with 2 decimals, half with 16-17 digits, 2-core
machine under load): this reader 332 ms, ``orjson.loads`` + ``repr`` 885 ms (2.7x),
``float`` + ``repr`` 1056 ms (3.2x).

Inlined into :mod:`.decode_kernel`. The kernels that inline these are compiled with
``cached_njit`` (:mod:`bergstream.core.kernel_cache`): their on-disk caches are keyed on this
module's source too, so changing it recompiles them."""

from __future__ import annotations

import numpy as np

from bergstream.core.api import cached_njit

__all__ = ["read_double", "read_long"]

_M32 = np.uint64(0xFFFFFFFF)
_U32 = np.uint64(32)
_U64_0 = np.uint64(0)
_U64_1 = np.uint64(1)
_POW5_MAX = 55
#: 5**k as (high, low) uint64 words, k = 0..55 (5**55 < 2**128).
_POW5_HI = np.array([(5**k) >> 64 for k in range(_POW5_MAX + 1)], dtype=np.uint64)
_POW5_LO = np.array([(5**k) & ((1 << 64) - 1) for k in range(_POW5_MAX + 1)], dtype=np.uint64)
#: 10.0**k, exact doubles for k = 0..22.
_POW10 = np.array([10.0**k for k in range(23)], dtype=np.float64)
_TWO53 = 2**53
_MIN_NORMAL = 2.2250738585072014e-308
_UNKNOWN = 2


@cached_njit(nogil=True, inline="always")
def _mul64(a: np.uint64, b: np.uint64) -> tuple[np.uint64, np.uint64]:
    """The 128-bit product of two uint64 as (high, low)."""
    a_lo = a & _M32
    a_hi = a >> _U32
    b_lo = b & _M32
    b_hi = b >> _U32
    p0 = a_lo * b_lo
    p1 = a_lo * b_hi
    p2 = a_hi * b_lo
    p3 = a_hi * b_hi
    mid = (p0 >> _U32) + (p1 & _M32) + (p2 & _M32)
    low = (p0 & _M32) | (mid << _U32)
    high = p3 + (p1 >> _U32) + (p2 >> _U32) + (mid >> _U32)
    return high, low


@cached_njit(nogil=True, inline="always")
def _mul_pow5(x: np.uint64, k: int) -> tuple[np.uint64, np.uint64, bool]:
    """``x * 5**k`` as (high, low) and whether it fits 128 bits."""
    ph, pl = _mul64(x, _POW5_LO[k])
    qh, ql = _mul64(x, _POW5_HI[k])
    high = ph + ql
    return high, pl, qh == _U64_0 and high >= ph


@cached_njit(nogil=True, inline="always")
def _bits64(word: np.uint64) -> int:
    n = 0
    while word != _U64_0:
        word >>= _U64_1
        n += 1
    return n


@cached_njit(nogil=True, inline="always")
def _bits128(high: np.uint64, low: np.uint64) -> int:
    return 64 + _bits64(high) if high != _U64_0 else _bits64(low)


@cached_njit(nogil=True, inline="always")
def _shl(high: np.uint64, low: np.uint64, s: int) -> tuple[np.uint64, np.uint64]:
    """``(high, low) << s`` for 0 <= s < 128 (the caller checked the result fits)."""
    if s == 0:
        return high, low
    if s >= 64:
        return low << np.uint64(s - 64), _U64_0
    return (high << np.uint64(s)) | (low >> np.uint64(64 - s)), low << np.uint64(s)


@cached_njit(nogil=True, inline="always")
def _cmp128(ah: np.uint64, al: np.uint64, bh: np.uint64, bl: np.uint64) -> int:
    if ah != bh:
        return 1 if ah > bh else -1
    if al != bl:
        return 1 if al > bl else -1
    return 0


@cached_njit(nogil=True)
def _compare(d: int, p: int, b: int, f: int) -> int:
    """The sign of ``d * 10**p - b * 2**f`` (d >= 0, 0 < b < 2**56), or 2 when 128 bits do not
    suffice to tell."""
    ud = np.uint64(d)
    ub = np.uint64(b)
    if d == 0:
        return -1
    if p >= 0:
        if p > _POW5_MAX:
            return _UNKNOWN
        lh, ll, fits = _mul_pow5(ud, p)
        if not fits:
            return _UNKNOWN
        s = f - p  # compare (lh, ll) with b << s
        if s >= 0:
            if _bits64(ub) + s > 128:
                return -1
            rh, rl = _shl(_U64_0, ub, s)
            return _cmp128(lh, ll, rh, rl)
        if _bits128(lh, ll) - s > 128:
            return 1
        lh, ll = _shl(lh, ll, -s)
        return _cmp128(lh, ll, _U64_0, ub)
    if -p > _POW5_MAX:
        return _UNKNOWN
    rh, rl, fits = _mul_pow5(ub, -p)
    if not fits:
        return _UNKNOWN
    s = f - p  # compare d with (rh, rl) << s
    if s >= 0:
        if _bits128(rh, rl) + s > 128:
            return -1
        rh, rl = _shl(rh, rl, s)
        return _cmp128(_U64_0, ud, rh, rl)
    if _bits64(ud) - s > 128:
        return 1
    dh, dl = _shl(_U64_0, ud, -s)
    return _cmp128(dh, dl, rh, rl)


@cached_njit(nogil=True)
def _exact(m: int, q: int, cell: np.ndarray, cell_bits: np.ndarray) -> tuple[bool, float]:
    """``m * 10**q`` (16 or more digits, or beyond the fast path) read exactly, and whether its
    text of ``m``'s digits is the shortest and nearest one of that float (``cell``: see
    :func:`read_double`)."""
    approx = float(m) * 10.0**q
    if not (_MIN_NORMAL <= approx < np.inf):
        return False, 0.0
    cell[0] = approx
    bits = cell_bits[0]
    for _ in range(4):
        exponent = (bits >> 52) & 0x7FF
        if exponent == 0 or exponent == 0x7FF:
            return False, 0.0
        fraction = bits & ((1 << 52) - 1)
        mant = fraction | (1 << 52)
        e = exponent - 1075
        if fraction == 0 and exponent > 1:  # the float below is nearer: half its gap
            lo_b, lo_f = 4 * mant - 1, e - 2
        else:
            lo_b, lo_f = 2 * mant - 1, e - 1
        hi_b, hi_f = 2 * mant + 1, e - 1
        # Inside the rounding interval; on its ends when the mantissa is even (ties to even).
        even = mant % 2 == 0
        above = _compare(m, q, hi_b, hi_f)
        if above == 1 or (above == 0 and not even):
            bits += 1
            continue
        if above == _UNKNOWN:
            return False, 0.0
        below = _compare(m, q, lo_b, lo_f)
        if below == -1 or (below == 0 and not even):
            bits -= 1
            continue
        if below == _UNKNOWN:
            return False, 0.0
        # Nearest text of its length: within half a unit of the last digit.
        if _compare(10 * m + 5, q - 1, mant, e) != 1:
            return False, 0.0
        if _compare(10 * m - 5, q - 1, mant, e) != -1:
            return False, 0.0
        # No text one digit shorter reads as it (an end of the interval reads as it when even).
        shorter = m // 10
        if shorter > 0:
            below = _compare(shorter, q + 1, lo_b, lo_f)
            if not (below == -1 or (below == 0 and not even)):
                return False, 0.0
        above = _compare(shorter + 1, q + 1, hi_b, hi_f)
        if not (above == 1 or (above == 0 and not even)):
            return False, 0.0
        cell_bits[0] = bits
        return True, cell[0]
    return False, 0.0


@cached_njit(nogil=True)
def read_double(
    buf: np.ndarray, start: int, end: int, scratch: np.ndarray, cell: np.ndarray,
    cell_bits: np.ndarray,
) -> tuple[bool, float]:  # fmt: skip
    """Whether ``buf[start:end]`` (a whole number token) is the canonical text of a double, and
    that double. ``scratch``: uint8 room for 64 bytes; ``cell``: one float64, ``cell_bits`` the
    same memory as int64 (to see a float's bits)."""
    pos = start
    negative = pos < end and buf[pos] == 45  # -
    if negative:
        pos += 1
    digits = 0  # significant digits kept in scratch (leading zeros dropped)
    m = 0
    point = -1  # digits seen (significant or not) before the point
    seen = 0
    exponent = 0
    while pos < end:
        c = buf[pos]
        if 48 <= c <= 57:
            if c != 48 or digits > 0:
                if digits >= 17:
                    return False, 0.0
                scratch[digits] = c
                digits += 1
                m = m * 10 + (c - 48)
            if point >= 0:
                exponent -= 1
            seen += 1
            pos += 1
        elif c == 46 and point < 0 and seen > 0:  # .
            point = seen
            pos += 1
        else:
            break
    if seen == 0 or point == seen:
        return False, 0.0
    if pos < end:
        if buf[pos] != 101 or pos + 2 >= end:  # e
            return False, 0.0
        sign = buf[pos + 1]
        if sign != 43 and sign != 45:
            return False, 0.0
        pos += 2
        written = 0
        count = 0
        while pos < end and 48 <= buf[pos] <= 57:
            written = written * 10 + (buf[pos] - 48)
            count += 1
            pos += 1
            if count > 4:
                return False, 0.0
        if pos != end or count == 0:
            return False, 0.0
        exponent += -written if sign == 45 else written
    # value = m * 10**exponent; trailing zeros of m belong to the exponent
    while digits > 0 and m % 10 == 0:
        m //= 10
        digits -= 1
        exponent += 1
    # Write repr's text of (negative, digits, decpt) and compare it with the token.
    at = 0
    if negative:
        scratch[32] = 45
        at = 1
    if digits == 0:
        for c in (48, 46, 48):  # 0.0
            scratch[32 + at] = c
            at += 1
    else:
        decpt = exponent + digits
        if -4 < decpt <= 16:
            if decpt <= 0:
                scratch[32 + at] = 48
                scratch[33 + at] = 46
                at += 2
                for _ in range(-decpt):
                    scratch[32 + at] = 48
                    at += 1
                for i in range(digits):
                    scratch[32 + at] = scratch[i]
                    at += 1
            else:
                for i in range(digits):
                    if i == decpt:
                        scratch[32 + at] = 46
                        at += 1
                    scratch[32 + at] = scratch[i]
                    at += 1
                if decpt >= digits:
                    for _ in range(decpt - digits):
                        scratch[32 + at] = 48
                        at += 1
                    scratch[32 + at] = 46
                    scratch[33 + at] = 48
                    at += 2
        else:
            scratch[32 + at] = scratch[0]
            at += 1
            if digits > 1:
                scratch[32 + at] = 46
                at += 1
                for i in range(1, digits):
                    scratch[32 + at] = scratch[i]
                    at += 1
            power = decpt - 1
            scratch[32 + at] = 101
            scratch[33 + at] = 45 if power < 0 else 43
            at += 2
            power = -power if power < 0 else power
            width = 2 if power < 100 else 3
            for i in range(width - 1, -1, -1):
                scratch[32 + at + i] = 48 + power % 10
                power //= 10
            at += width
    if at != end - start:
        return False, 0.0
    for i in range(at):
        if scratch[32 + i] != buf[start + i]:
            return False, 0.0
    if digits == 0:
        return True, -0.0 if negative else 0.0
    q = exponent
    value = 0.0
    fast = False
    if digits <= 15:
        if 0 <= q <= 22:
            value = float(m) * _POW10[q]
            fast = True
        elif -22 <= q < 0:
            value = float(m) / _POW10[-q]
            fast = True
        elif 22 < q <= 37:
            scaled = m
            for _ in range(q - 22):
                scaled *= 10
                if scaled >= _TWO53:
                    break
            if scaled < _TWO53:
                value = float(scaled) * _POW10[22]
                fast = True
    if not fast:
        ok, value = _exact(m, q, cell, cell_bits)
        if not ok:
            return False, 0.0
    return True, -value if negative else value


@cached_njit(nogil=True)
def read_long(buf: np.ndarray, pos: int, end: int) -> tuple[int, int]:
    """The canonical integer token at ``pos`` (``-?(0|[1-9][0-9]*)`` in the int64 range, not
    ``-0``, followed by none of ``.eE`` or a digit): its value and the position after it
    (-1 when it is not one)."""
    negative = pos < end and buf[pos] == 45
    if negative:
        pos += 1
    if pos >= end or not 48 <= buf[pos] <= 57:
        return 0, -1
    if buf[pos] == 48:
        pos += 1
        if negative or (pos < end and (48 <= buf[pos] <= 57 or buf[pos] in (46, 69, 101))):
            return 0, -1
        return 0, pos
    value = 0  # accumulated negative, so -2**63 fits
    count = 0
    while pos < end and 48 <= buf[pos] <= 57:
        digit = buf[pos] - 48
        if count >= 18:
            if count >= 19 or value < -922337203685477580:
                return 0, -1
            if value == -922337203685477580 and digit > 8:
                return 0, -1
        value = value * 10 - digit
        count += 1
        pos += 1
    if pos < end and buf[pos] in (46, 69, 101):
        return 0, -1
    if not negative:
        if value == -9223372036854775808:
            return 0, -1
        value = -value
    return value, pos
