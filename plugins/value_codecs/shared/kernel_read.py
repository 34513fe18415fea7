"""Reading payloads in the kernels (numba): little-endian numbers, UTF-8 validation, big-endian
128-bit decimals, UUID strings, duplicate map keys, and copying byte runs (core's
``copy_bytes``, one ``memcpy``, re-exported here; an ASCII check a word at a time: a loop over
single bytes takes most of the kernel's time on string-heavy values).

These functions are inlined into (or called from) every kernel of the value codecs: the
Avro, JSON Schema and Protobuf decoders and encoders, the arena helpers and the plain JSON
scanner. The kernels that inline these are compiled with ``cached_njit``
(:mod:`bergstream.core.kernel_cache`): their on-disk caches are keyed on this module's source
too, so changing it recompiles them."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from llvmlite import ir
from numba import types
from numba.core.base import BaseContext
from numba.core.typing.templates import Signature
from numba.extending import intrinsic

from bergstream.core.api import cached_njit, copy_bytes

__all__ = [
    "copy_bytes",
    "equal_bytes",
    "high_bit_set",
    "load_word",
    "mark_duplicates",
    "read_be128",
    "read_le",
    "read_uuid",
    "utf8_ok",
]


def _contiguous_bytes(array: types.Type) -> bool:
    return isinstance(array, types.Array) and array.dtype == types.uint8 and array.layout == "C"


@intrinsic
def load_word(
    typingctx: object, src: types.Type, at: types.Type
) -> tuple[Signature, Callable[..., object]]:
    """The 8 bytes of a contiguous uint8 array at ``at`` as one (unaligned, native-endian)
    int64 (bounds are the caller's)."""
    if not _contiguous_bytes(src):
        return None  # type: ignore[return-value]  # not typed: numba reports the call

    def codegen(
        context: BaseContext, builder: ir.IRBuilder, signature: Signature, args: list[ir.Value]
    ) -> ir.Value:
        source = context.make_array(signature.args[0])(context, builder, args[0])
        pointer = builder.gep(source.data, [args[1]])
        return builder.load(builder.bitcast(pointer, ir.IntType(64).as_pointer()), align=1)

    return types.int64(src, types.intp), codegen


_HIGH_BITS = np.int64(-0x7F7F7F7F7F7F7F80)  # 0x8080808080808080


@cached_njit(nogil=True, inline="always")
def high_bit_set(buf: np.ndarray, pos: int, length: int) -> bool:
    """Whether a byte of ``buf[pos : pos + length]`` is above 0x7F (8 bytes at a time)."""
    if length < 8:
        tail = 0
        for i in range(length):
            tail |= buf[pos + i]
        return tail >= 0x80
    words = load_word(buf, pos + length - 8)  # the last 8 bytes (overlapping the loop's)
    i = 0
    while i + 8 <= length:
        words |= load_word(buf, pos + i)
        i += 8
    return (words & _HIGH_BITS) != 0


@cached_njit(nogil=True, inline="always")
def read_le(buf: np.ndarray, pos: int, size: int) -> int:
    """The little-endian integer of ``size`` (4 or 8) bytes at ``pos``, sign-extended."""
    value = np.int64(0)
    for i in range(size):
        value |= np.int64(buf[pos + i]) << (8 * i)
    if size == 4 and value >= 2**31:
        value -= 2**32
    return value


@cached_njit(nogil=True)
def utf8_ok(buf: np.ndarray, pos: int, end: int) -> bool:
    """Whether ``buf[pos:end]`` is well-formed UTF-8 (no overlong forms, surrogates or code
    points above U+10FFFF), as Python's strict decoder requires."""
    while pos < end:
        byte = buf[pos]
        if byte < 0x80:
            pos += 1
            continue
        if byte < 0xC2 or byte > 0xF4:
            return False
        if byte < 0xE0:
            need, low, high = 1, 0x80, 0xBF
        elif byte < 0xF0:
            need = 2
            low = 0xA0 if byte == 0xE0 else 0x80
            high = 0x9F if byte == 0xED else 0xBF
        else:
            need = 3
            low = 0x90 if byte == 0xF0 else 0x80
            high = 0x8F if byte == 0xF4 else 0xBF
        if pos + need >= end:
            return False
        second = buf[pos + 1]
        if second < low or second > high:
            return False
        for i in range(2, need + 1):
            if buf[pos + i] & 0xC0 != 0x80:
                return False
        pos += need + 1
    return True


@cached_njit(nogil=True, inline="always")
def read_be128(buf: np.ndarray, pos: int, size: int) -> tuple[int, int, bool]:
    """The big-endian two's complement integer of ``size`` bytes as (high, low) words, and
    whether it fits 128 bits."""
    if size == 0:
        return 0, 0, True
    negative = buf[pos] >= 0x80
    skip = size - 16
    if skip > 0:
        fill = 0xFF if negative else 0
        for i in range(skip):
            if buf[pos + i] != fill:
                return 0, 0, False
        if (buf[pos + skip] >= 0x80) != negative:
            return 0, 0, False
    else:
        skip = 0
    high = np.int64(-1 if negative else 0)
    low = np.int64(-1 if negative else 0)
    for i in range(skip, size):
        high = (high << 8) | ((low >> 56) & 0xFF)
        low = (low << 8) | np.int64(buf[pos + i])
    return high, low, True


@cached_njit(nogil=True, inline="always")
def _hex(byte: int) -> int:
    """A hex digit's value (16 + value for an uppercase letter), -1 if not a hex digit."""
    if 48 <= byte <= 57:
        return byte - 48
    if 97 <= byte <= 102:
        return byte - 87
    if 65 <= byte <= 70:
        return byte - 55 + 16
    return -1


_URN = np.frombuffer(b"urn:uuid:", dtype=np.uint8)


@cached_njit(nogil=True)
def read_uuid(buf: np.ndarray, pos: int, length: int, out: np.ndarray, at: int) -> int:
    """Parse the UUID string of ``length`` bytes at ``pos`` into ``out[at:at+16]``: 0 if it is
    canonical (36 lowercase characters, hyphens at 8, 13, 18, 23), 1 if it is another form
    Python's ``uuid.UUID`` reads (uppercase digits, no hyphens, braces, a ``urn:uuid:``
    prefix), -1 if it is not a UUID."""
    odd = 0
    if length >= 2 and buf[pos] == 123 and buf[pos + length - 1] == 125:  # {...}
        pos += 1
        length -= 2
        odd = 1
    elif length > 9:
        prefixed = True
        for i in range(9):
            if buf[pos + i] != _URN[i]:
                prefixed = False
                break
        if prefixed:
            pos += 9
            length -= 9
            odd = 1
    if length == 32:
        odd = 1
    elif length != 36:
        return -1
    n = 0
    i = 0
    while i < length:
        if length == 36 and (i == 8 or i == 13 or i == 18 or i == 23):
            if buf[pos + i] != 45:
                return -1
            i += 1
            continue
        a = _hex(buf[pos + i])
        b = _hex(buf[pos + i + 1])
        if a < 0 or b < 0:
            return -1
        if a >= 16 or b >= 16:
            odd = 1
        out[at + n] = ((a & 15) << 4) | (b & 15)
        n += 1
        i += 2
    return odd


# Not inlined by numba, and no reference counting: see :mod:`.arena_kernel`.
@cached_njit(nogil=True, _nrt=False)
def equal_bytes(a: np.ndarray, a_at: int, b: np.ndarray, b_at: int, length: int) -> bool:
    """Whether ``a[a_at : a_at + length]`` and ``b[b_at : b_at + length]`` are the same bytes."""
    i = 0
    while i < length and a[a_at + i] == b[b_at + i]:
        i += 1
    return i == length


@cached_njit(nogil=True)
def mark_duplicates(
    a64: np.ndarray, a8: np.ndarray, cbase: np.ndarray, offsets_col: int, data_col: int,
    first: int, last: int, flags: np.ndarray,
) -> bool:  # fmt: skip
    """Mark in ``flags[0:last-first]`` the map entries ``[first, last)`` whose key appears again
    later (the last occurrence wins); whether any was marked."""
    obase = cbase[offsets_col]
    dbase = cbase[data_col]
    count = last - first
    found = False
    hashes = np.empty(count, dtype=np.int64)
    for j in range(count):
        h = np.int64(-3750763034362895579)
        for p in range(a64[obase + first + j], a64[obase + first + j + 1]):
            h = (h ^ np.int64(a8[dbase + p])) * np.int64(1099511628211)
        hashes[j] = h
        flags[j] = 0
    order = np.argsort(hashes, kind="mergesort")
    for i in range(count - 1):
        j = order[i]
        k = order[i + 1]
        if hashes[j] != hashes[k]:
            continue
        sj = a64[obase + first + j]
        ej = a64[obase + first + j + 1]
        sk = a64[obase + first + k]
        ek = a64[obase + first + k + 1]
        if ej - sj != ek - sk:
            continue
        # mergesort keeps equal hashes in entry order: j comes before k
        if equal_bytes(a8, dbase + sj, a8, dbase + sk, ej - sj):
            flags[j] = 1
            found = True
    return found
