"""The compiled Protobuf encoder (numba): an interpreter of the programs of
:mod:`.encoder` that reads Arrow columns and writes upb's deterministic serialization
of each row's message, after the message-index list ``00``.

Columns are addressed by index, not read with cursors: a message's fields read the entry of its
own index (a struct's children share their parent's), a list or map walks its elements' indexes
from its offsets. A null struct is simply not visited, so nothing under it has to be skipped.

A nested message is written behind a one-byte length placeholder; when its length needs more
bytes, its body is moved right once it is complete (messages are short: the move is rare).

A row whose value needs the upb path is marked ``slow`` and gets an empty payload: a map with
two or more entries (upb's deterministic entry order is not key order), two members of one
oneof set, a NaN float or double (its bits may change through a Python float), an enum string
that is neither a name nor a canonical int32 (or names no value of a closed enum), a
``uint32`` / ``fixed32`` out of range, a ``uint64`` / ``fixed64`` decimal out of range, a
string that is not UTF-8. upb then gives exactly what it gave before (or raises the same way).

Compiled with ``cached_njit`` (:mod:`bergstream.core.kernel_cache`): its on-disk cache is keyed
on the source of this file and of every module it imports, so it is recompiled after any of
them changes.
"""

from __future__ import annotations

import numpy as np

from bergstream.core.api import cached_njit, put_varint, put_zigzag, varint_size
from bergstream.plugins.value_codecs.shared.kernel_read import (
    copy_bytes,
    equal_bytes,
    high_bit_set,
    utf8_ok,
)
from bergstream.plugins.value_codecs.shared.kernel_write import grow, put_le

__all__ = [
    "C_BOOL",
    "C_BYTES",
    "C_DOUBLE",
    "C_ENUM",
    "C_FIXED32",
    "C_FIXED64",
    "C_FLOAT",
    "C_INT32",
    "C_INT64",
    "C_SFIXED32",
    "C_SFIXED64",
    "C_SINT32",
    "C_SINT64",
    "C_STRING",
    "C_UINT32",
    "C_UINT64",
    "OP_CLOSE",
    "OP_EMPTY",
    "OP_END",
    "OP_LOOP",
    "OP_MSG",
    "OP_NEXT",
    "OP_ONEOF",
    "OP_PACKED",
    "OP_SCALAR",
    "OP_TIME",
    "encode_rows",
]

# Opcodes: row = [op, a, b, c, d, e, f, g].
OP_END = 0  # the row's message is complete
OP_SCALAR = 1  # a=tag (-1: none, an element of a packed run), b=conv, c=col, d=data col,
#                e=validity col (-1: none), f=1 implicit presence (a default is not written),
#                g=the enum's table in etab (-1: none)
OP_MSG = 2  # a=tag, b=validity col (-1: always written), c=pc when absent, d=group end tag
#             (0: length-delimited): a nested message starts
OP_CLOSE = 3  # a=group end tag (0: length-delimited): the nested message ends
OP_TIME = 4  # a=tag, b=col (microseconds), c=validity col, d=1 Duration (0 Timestamp)
OP_EMPTY = 5  # a=tag, b=col (bool), c=validity col, d=group end tag, e=1: written whatever
#               the value (an element or map value), else only when valid and true
OP_LOOP = 6  # a=offsets col, b=pc after the loop, c=1 for a map (two entries or more: slow)
OP_NEXT = 7  # a=pc of the element's code, b=1 ending a packed run: the next element, or the
#              loop ends
OP_PACKED = 8  # as OP_LOOP (c=0), d=tag: a packed run (its tag and length) starts
OP_ONEOF = 9  # a=first pair in aux, b=pairs (validity col, bool col of an empty message or -1):
#               more than one member set is slow

# Value conversions.
C_INT32, C_SINT32, C_SFIXED32 = 1, 2, 3
C_INT64, C_SINT64, C_SFIXED64 = 4, 5, 6
C_UINT32, C_FIXED32, C_UINT64, C_FIXED64 = 7, 8, 9, 10
C_FLOAT, C_DOUBLE, C_BOOL, C_STRING, C_BYTES, C_ENUM = 11, 12, 13, 14, 15, 16

_INT32_MIN = -(2**31)
_INT32_MAX = 2**31 - 1
_UINT32_LIMIT = 2**32
_MICROS = 1_000_000
_ROOM = 64  # bytes an op writes at most, besides the bytes of a string


@cached_njit(nogil=True, inline="always")
def _close(out: np.ndarray, pos: int, mark: int) -> int:
    """End the length-delimited body after the one-byte placeholder at ``mark``: write its
    length there, moving the body right if the length needs more bytes (room for 9 more
    checked by the caller). Returns the position after the body."""
    length = pos - mark - 1
    if length < 0x80:
        out[mark] = length
        return pos
    extra = varint_size(length) - 1
    for i in range(pos - 1, mark, -1):
        out[i + extra] = out[i]
    put_varint(out, mark, length)
    return pos + extra


@cached_njit(nogil=True)
def _enum_number(
    a8: np.ndarray, start: int, length: int, etab: np.ndarray, at: int, name_data: np.ndarray
) -> tuple[int, bool]:
    """The number of the enum value named ``a8[start:start+length]`` (a name of the enum whose
    table starts at ``etab[at]``, or a number's canonical decimal digits), and whether upb
    encodes it as the codec would."""
    count = etab[at]
    for k in range(at + 2, at + 2 + 3 * count, 3):
        s = etab[k + 1]
        if etab[k + 2] - s == length and equal_bytes(name_data, s, a8, start, length):
            return etab[k], True
    # Canonical decimal digits: -?(0|[1-9][0-9]*), within int32.
    i = 0
    negative = length > 0 and a8[start] == 45  # "-"
    if negative:
        i = 1
    if i >= length or length - i > 10:
        return 0, False
    if a8[start + i] == 48 and (length - i > 1 or negative):  # "0" leading, or "-0"
        return 0, False
    number = 0
    while i < length:
        digit = np.int64(a8[start + i]) - 48
        if digit < 0 or digit > 9:
            return 0, False
        number = number * 10 + digit
        i += 1
    if negative:
        number = -number
    if number < _INT32_MIN or number > _INT32_MAX:
        return 0, False
    if etab[at + 1] == 1:  # a closed enum: only its own numbers
        for k in range(at + 2, at + 2 + 3 * count, 3):
            if etab[k] == number:
                return number, True
        return 0, False
    return number, True


@cached_njit(nogil=True)
def encode_rows(
    rows: int, code: np.ndarray, aux: np.ndarray, etab: np.ndarray, name_data: np.ndarray,
    a64: np.ndarray, a32: np.ndarray, a8: np.ndarray, cbase: np.ndarray,
    stack: np.ndarray, out: np.ndarray, out_offsets: np.ndarray, slow: np.ndarray,
) -> np.ndarray:  # fmt: skip
    """Encode ``rows`` messages (row ``i`` at index ``i`` of the root's columns) into ``out``
    (grown as needed, and returned); ``out_offsets`` gets each payload's bounds, ``slow[i]`` 1
    for a row left empty for the upb path."""
    # Values are read and written here, not in helpers: an inlined helper taking the arenas
    # costs reference count updates for each array at each call (measured: 3x slower).
    pos = 0
    out_offsets[0] = 0
    for row in range(rows):
        first = pos
        out[pos] = 0  # the message-index list [0]
        pos += 1
        idx = row
        sp = 0
        pc = 0
        ok = True
        while ok:
            if pos + _ROOM > out.size:
                out = grow(out, pos, pos + _ROOM)
            op = code[pc, 0]
            if op == OP_SCALAR:
                valid = code[pc, 5]
                if valid >= 0 and a8[cbase[valid] + idx] == 0:
                    pc += 1
                    continue
                conv = code[pc, 2]
                col = code[pc, 3]
                start = 0
                if conv in (C_STRING, C_BYTES, C_ENUM):
                    at = cbase[col] + idx
                    start = cbase[code[pc, 4]] + a64[at]
                    value = a64[at + 1] - a64[at]
                    if conv == C_ENUM:
                        value, ok = _enum_number(a8, start, value, etab, code[pc, 7], name_data)
                    elif (
                        conv == C_STRING
                        and high_bit_set(a8, start, value)
                        and not utf8_ok(a8, start, start + value)
                    ):
                        ok = False
                elif conv in (C_INT32, C_SINT32, C_SFIXED32):
                    value = np.int64(a32[cbase[col] + idx])
                elif conv == C_FLOAT:
                    value = np.int64(a32[cbase[col] + idx]) & 0xFFFFFFFF
                    ok = (value & 0x7F800000) != 0x7F800000 or (value & 0x7FFFFF) == 0
                elif conv == C_BOOL:
                    value = 1 if a8[cbase[col] + idx] != 0 else 0
                elif conv in (C_UINT64, C_FIXED64):
                    value = a64[cbase[col] + 2 * idx]
                    ok = a64[cbase[col] + 2 * idx + 1] == 0
                else:
                    value = a64[cbase[col] + idx]
                    if conv in (C_UINT32, C_FIXED32):
                        ok = 0 <= value < _UINT32_LIMIT
                    elif conv == C_DOUBLE:
                        ok = ((value >> 52) & 0x7FF) != 0x7FF or (value & 0xFFFFFFFFFFFFF) == 0
                if not ok:
                    break
                tag = code[pc, 1]
                implicit = code[pc, 6]
                pc += 1
                if implicit == 1 and value == 0:
                    continue
                if tag >= 0:
                    pos = put_varint(out, pos, tag)
                if conv in (C_STRING, C_BYTES):
                    if pos + _ROOM + value > out.size:
                        out = grow(out, pos, pos + _ROOM + value)
                    pos = put_varint(out, pos, value)
                    copy_bytes(out, pos, a8, start, value)
                    pos += value
                elif conv in (C_FIXED32, C_SFIXED32, C_FLOAT):
                    pos = put_le(out, pos, value, 4)
                elif conv in (C_FIXED64, C_SFIXED64, C_DOUBLE):
                    pos = put_le(out, pos, value, 8)
                elif conv == C_SINT32:
                    pos = put_varint(out, pos, ((value << 1) ^ (value >> 31)) & 0xFFFFFFFF)
                elif conv == C_SINT64:
                    pos = put_zigzag(out, pos, value)
                else:
                    pos = put_varint(out, pos, value)
            elif op == OP_MSG:
                valid = code[pc, 2]
                if valid >= 0 and a8[cbase[valid] + idx] == 0:
                    pc = code[pc, 3]
                    continue
                pos = put_varint(out, pos, code[pc, 1])
                stack[sp, 0] = pos
                sp += 1
                if code[pc, 4] == 0:
                    pos += 1  # the length's placeholder
                pc += 1
            elif op == OP_CLOSE:
                sp -= 1
                if code[pc, 1] == 0:
                    pos = _close(out, pos, stack[sp, 0])
                else:
                    pos = put_varint(out, pos, code[pc, 1])
                pc += 1
            elif op == OP_TIME:
                valid = code[pc, 3]
                if valid >= 0 and a8[cbase[valid] + idx] == 0:
                    pc += 1
                    continue
                micros = a64[cbase[code[pc, 2]] + idx]
                seconds = micros // _MICROS  # floor division, as Python's divmod
                rest = micros - seconds * _MICROS
                if code[pc, 4] == 1 and micros < 0 and rest != 0:
                    seconds += 1  # a Duration's parts have the sign of the whole
                    rest -= _MICROS
                nanos = rest * 1000
                pos = put_varint(out, pos, code[pc, 1])
                mark = pos
                pos += 1
                if seconds != 0:
                    out[pos] = 0x08
                    pos = put_varint(out, pos + 1, seconds)
                if nanos != 0:
                    out[pos] = 0x10
                    pos = put_varint(out, pos + 1, nanos)
                out[mark] = pos - mark - 1  # at most 22 bytes
                pc += 1
            elif op == OP_EMPTY:
                if code[pc, 5] == 0:
                    valid = code[pc, 3]
                    if valid >= 0 and a8[cbase[valid] + idx] == 0:
                        pc += 1
                        continue
                    if a8[cbase[code[pc, 2]] + idx] == 0:
                        pc += 1
                        continue
                pos = put_varint(out, pos, code[pc, 1])
                if code[pc, 4] == 0:
                    out[pos] = 0
                    pos += 1
                else:
                    pos = put_varint(out, pos, code[pc, 4])
                pc += 1
            elif op in (OP_LOOP, OP_PACKED):
                at = cbase[code[pc, 1]] + idx
                begin = a64[at]
                end = a64[at + 1]
                if begin == end:
                    pc = code[pc, 2]
                    continue
                if code[pc, 3] == 1 and end - begin > 1:
                    ok = False
                    break
                if op == OP_PACKED:
                    pos = put_varint(out, pos, code[pc, 4])
                    stack[sp, 2] = pos
                    pos += 1  # the length's placeholder
                stack[sp, 0] = idx
                stack[sp, 1] = end
                sp += 1
                idx = begin
                pc += 1
            elif op == OP_NEXT:
                idx += 1
                if idx < stack[sp - 1, 1]:
                    pc = code[pc, 1]
                    continue
                sp -= 1
                idx = stack[sp, 0]
                if code[pc, 2] == 1:  # the end of a packed run
                    pos = _close(out, pos, stack[sp, 2])
                pc += 1
            elif op == OP_ONEOF:
                present = 0
                for k in range(code[pc, 1], code[pc, 1] + code[pc, 2]):
                    valid = aux[k, 0]
                    flag = aux[k, 1]
                    if a8[cbase[valid] + idx] != 0 and (flag < 0 or a8[cbase[flag] + idx] != 0):
                        present += 1
                if present > 1:
                    ok = False
                    break
                pc += 1
            else:  # OP_END
                break
        if not ok:
            pos = first
            slow[row] = 1
        out_offsets[row + 1] = pos
    return out
