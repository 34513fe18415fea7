"""The compiled JSON reader (numba) for rows in the json-schema codec's canonical form.

One interpreter of the programs :mod:`.program` compiles, walking N payloads and appending
to column arenas (int64, int32 and uint8: :mod:`..shared.arena_columns`; see :mod:`..avro.ops` for
the pads). It reads only the canonical text of a value (the exact bytes
:meth:`JsonSchemaCodec.encode` would write for what it read): the first byte that differs
makes it give up on the row (its columns are rolled back and filled with the null row, and
``fallback[row]`` is set), so the codec decodes that row the general way. Rows it finishes are
canonical: their bytes need not be kept.

Compiled with ``cached_njit`` (:mod:`bergstream.core.kernel_cache`): its on-disk cache is keyed
on the source of this file and of every module it imports, so it is recompiled after any of
them changes.
"""

from __future__ import annotations

import numpy as np

from bergstream.core.api import cached_njit
from bergstream.plugins.value_codecs.json_schema.number_reading import read_double, read_long
from bergstream.plugins.value_codecs.shared.arena_kernel import (
    DONE,
    OVERFLOW,
    append_offset,
    append_pads,
    append_string,
    append_valid,
    end_row,
    end_string,
    string_room,
)
from bergstream.plugins.value_codecs.shared.kernel_read import (
    high_bit_set,
    mark_duplicates,
    read_uuid,
    utf8_ok,
)

__all__ = ["DONE", "OVERFLOW", "read_rows"]

# Opcodes: an instruction is a row of 8 int64, the opcode then its operands.
OP_END = 0
OP_VALID = 1  # a=validity col8: the value is there
OP_NULLABLE = 2  # a=validity col8, b=first pad, c=pad count, d=pc after the value: null or not
OP_OBJECT = 3  # "{" of a struct: pushes a frame
OP_FIELD = 4  # a=first literal byte, b=literal length, c=1 if it may be left out,
#               d=first pad, e=pad count, f=pc after the field's value
OP_CLOSE = 5  # "}" of a struct: pops its frame
OP_LONG = 6  # a=col64
OP_DOUBLE = 7  # a=col64 (read as float64)
OP_BOOL = 8  # a=col8
OP_STRING = 9  # a=offsets col64, b=data col8
OP_TIMESTAMP = 10  # a=col64 (microseconds)
OP_DATE = 11  # a=col32 (days)
OP_UUID = 12  # a=col8 (16 bytes)
OP_LIST = 13  # a=offsets col64, b=pc after the matching OP_LIST_NEXT
OP_LIST_NEXT = 14  # a=first pc of an item, b=offsets col64
OP_MAP = 15  # a=offsets col64, b=pc after the matching OP_MAP_NEXT
OP_MAP_KEY = 16  # a=keys offsets col64, b=keys data col8
OP_MAP_NEXT = 17  # a=first pc of an entry, b=offsets col64, c=keys offsets, d=keys data

_GIVE_UP = -2  # "over" value: the row is not canonical (or not valid)

_DAYS_BEFORE_MONTH = np.array([0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334, 365])


@cached_njit(nogil=True, inline="always")
def _digits(buf: np.ndarray, pos: int, count: int) -> int:
    """The decimal number of ``count`` ASCII digits at ``pos``, -1 if one is not a digit."""
    value = 0
    for i in range(count):
        c = buf[pos + i]
        if c < 48 or c > 57:
            return -1
        value = value * 10 + (c - 48)
    return value


@cached_njit(nogil=True, inline="always")
def _days(year: int, month: int, day: int) -> int:
    """Days from 1970-01-01 to a valid proleptic Gregorian date; -10**9 if it is not valid."""
    if year < 1 or month < 1 or month > 12 or day < 1:
        return -(10**9)
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    length = _DAYS_BEFORE_MONTH[month] - _DAYS_BEFORE_MONTH[month - 1]
    if month == 2 and leap:
        length += 1
    if day > length:
        return -(10**9)
    y = year - 1
    ordinal = y * 365 + y // 4 - y // 100 + y // 400 + _DAYS_BEFORE_MONTH[month - 1] + day
    if month > 2 and leap:
        ordinal += 1
    return ordinal - 719163  # date(1970, 1, 1).toordinal()


@cached_njit(nogil=True, inline="always")
def _date(buf: np.ndarray, pos: int) -> int:
    """The days of the ``YYYY-MM-DD`` at ``pos`` (10 bytes there), -10**9 if not one."""
    if buf[pos + 4] != 45 or buf[pos + 7] != 45:
        return -(10**9)
    year = _digits(buf, pos, 4)
    month = _digits(buf, pos + 5, 2)
    day = _digits(buf, pos + 8, 2)
    if year < 0 or month < 0 or day < 0:
        return -(10**9)
    return _days(year, month, day)


@cached_njit(nogil=True)
def _timestamp(buf: np.ndarray, pos: int, end: int) -> tuple[int, int]:
    """The canonical ``"YYYY-MM-DDTHH:MM:SS[.ffffff]Z"`` at ``pos``: microseconds since the
    epoch and the position after it (-1 if it is not one)."""
    if pos + 22 > end or buf[pos] != 34:
        return 0, -1
    days = _date(buf, pos + 1)
    if days == -(10**9) or buf[pos + 11] != 84 or buf[pos + 14] != 58 or buf[pos + 17] != 58:
        return 0, -1
    hour = _digits(buf, pos + 12, 2)
    minute = _digits(buf, pos + 15, 2)
    second = _digits(buf, pos + 18, 2)
    if hour < 0 or hour > 23 or minute < 0 or minute > 59 or second < 0 or second > 59:
        return 0, -1
    micros = 0
    at = pos + 20
    if buf[at] == 46:  # .ffffff, never .000000
        if at + 9 > end:
            return 0, -1
        micros = _digits(buf, at + 1, 6)
        if micros <= 0:
            return 0, -1
        at += 7
    if at + 2 > end or buf[at] != 90 or buf[at + 1] != 34:
        return 0, -1
    seconds = ((days * 24 + hour) * 60 + minute) * 60 + second
    return seconds * 1_000_000 + micros, at + 2


@cached_njit(nogil=True)
def _string(buf: np.ndarray, pos: int, end: int) -> tuple[int, int, bool]:
    """The canonical JSON string at ``pos`` (``"`` first): the position after its closing
    quote (-1 if it is not canonical: an escape ``json.dumps`` does not write, a raw control
    character, bad UTF-8), its decoded length, whether it has escapes."""
    if pos >= end or buf[pos] != 34:
        return -1, 0, False
    pos += 1
    start = pos
    length = 0
    escaped = False
    while pos < end:
        c = buf[pos]
        if c == 34:
            if high_bit_set(buf, start, pos - start) and not utf8_ok(buf, start, pos):
                return -1, 0, False
            return pos + 1, length, escaped
        if c < 32:
            return -1, 0, False
        if c == 92:
            if pos + 1 >= end:
                return -1, 0, False
            e = buf[pos + 1]
            if e in (34, 92, 98, 102, 110, 114, 116):  # \" \\ \b \f \n \r \t
                pos += 2
            elif e == 117:  # \u00XX, lower-case hex, a control character without short form
                if pos + 6 > end or buf[pos + 2] != 48 or buf[pos + 3] != 48:
                    return -1, 0, False
                high = buf[pos + 4]
                low = buf[pos + 5]
                if high not in (48, 49):
                    return -1, 0, False
                if 48 <= low <= 57:
                    code = (high - 48) * 16 + low - 48
                elif 97 <= low <= 102:
                    code = (high - 48) * 16 + low - 87
                else:
                    return -1, 0, False
                if code in (8, 9, 10, 12, 13):
                    return -1, 0, False
                pos += 6
            else:
                return -1, 0, False
            escaped = True
            length += 1
            continue
        pos += 1
        length += 1
    return -1, 0, False


@cached_njit(nogil=True)
def _unescape(buf: np.ndarray, pos: int, end: int, out: np.ndarray, at: int) -> None:
    """Write the decoded bytes of the canonical string body ``buf[pos:end]`` at ``out[at]``."""
    while pos < end:
        c = buf[pos]
        if c != 92:
            out[at] = c
            at += 1
            pos += 1
            continue
        e = buf[pos + 1]
        if e == 117:
            low = buf[pos + 5]
            digit = low - 48 if low <= 57 else low - 87
            out[at] = (buf[pos + 4] - 48) * 16 + digit
            pos += 6
        else:
            if e == 98:
                out[at] = 8
            elif e == 102:
                out[at] = 12
            elif e == 110:
                out[at] = 10
            elif e == 114:
                out[at] = 13
            elif e == 116:
                out[at] = 9
            else:
                out[at] = e
            pos += 2
        at += 1


@cached_njit(nogil=True, inline="always")
def _is(buf: np.ndarray, pos: int, end: int, a: int, b: int, c: int, d: int) -> bool:
    """Whether the 4 bytes at ``pos`` are ``a b c d``."""
    return (
        pos + 4 <= end
        and buf[pos] == a
        and buf[pos + 1] == b
        and buf[pos + 2] == c
        and buf[pos + 3] == d
    )


@cached_njit(nogil=True)
def read_rows(
    buf: np.ndarray, offsets: np.ndarray, skip: int, start_row: int,
    code: np.ndarray, pads: np.ndarray, literals: np.ndarray,
    root_pad_first: int, root_pad_count: int,
    a64: np.ndarray, f64: np.ndarray, a32: np.ndarray, a8: np.ndarray,
    cbase: np.ndarray, ccap: np.ndarray, clen: np.ndarray,
    fallback: np.ndarray, stack: np.ndarray,
) -> tuple[int, int, int]:  # fmt: skip
    """Read payloads ``start_row..`` (``buf[offsets[i] + skip : offsets[i+1]]``); ``f64`` is
    ``a64`` seen as float64. Returns (status, row, column): :data:`DONE`, or :data:`OVERFLOW`
    with the row to resume at and the column that needs room (nothing of that row kept)."""
    rows = offsets.size - 1
    saved = np.empty(clen.size, dtype=np.int64)
    flags = np.empty(64, dtype=np.uint8)
    scratch = np.empty(64, dtype=np.uint8)
    cell = np.empty(1, dtype=np.float64)
    cell_bits = cell.view(np.int64)
    no_symbols = np.zeros(1, dtype=np.int64)  # JSON pads have no enum symbols
    no_data = np.empty(0, dtype=np.uint8)
    for row in range(start_row, rows):
        pos = offsets[row] + skip
        end = offsets[row + 1]
        for c in range(clen.size):
            saved[c] = clen[c]
        over = -1
        sp = 0
        pc = 0
        while True:
            op = code[pc, 0]
            if op == OP_FIELD:
                first = stack[sp - 1, 1] == 1
                at = pos
                length = code[pc, 2]
                ok = True
                if not first:
                    ok = at < end and buf[at] == 44  # ,
                    at += 1
                if ok and at + length <= end:
                    lit = code[pc, 1]
                    for i in range(length):
                        if buf[at + i] != literals[lit + i]:
                            ok = False
                            break
                else:
                    ok = False
                if ok:
                    pos = at + length
                    stack[sp - 1, 1] = 0
                    pc += 1
                elif code[pc, 3] == 1:
                    over = append_pads(
                        pads, code[pc, 4], code[pc, 5], no_symbols, no_data,
                        a64, a32, a8, cbase, ccap, clen,
                    )  # fmt: skip
                    if over >= 0:
                        break
                    pc = code[pc, 6]
                else:
                    over = _GIVE_UP
                    break
            elif op in (OP_VALID, OP_BOOL):
                col = code[pc, 1]
                at = clen[col]
                if at >= ccap[col]:
                    over = col
                    break
                if op == OP_VALID:
                    a8[cbase[col] + at] = 1
                elif _is(buf, pos, end, 116, 114, 117, 101):  # true
                    a8[cbase[col] + at] = 1
                    pos += 4
                elif (
                    _is(buf, pos, end, 102, 97, 108, 115) and pos + 4 < end and buf[pos + 4] == 101
                ):
                    a8[cbase[col] + at] = 0  # false
                    pos += 5
                else:
                    over = _GIVE_UP
                    break
                clen[col] = at + 1
                pc += 1
            elif op in (OP_STRING, OP_MAP_KEY):
                after, length, escaped = _string(buf, pos, end)
                if after < 0:
                    over = _GIVE_UP
                    break
                col = code[pc, 1]
                data = code[pc, 2]
                if escaped:
                    over = string_room(ccap, clen, col, data, length)
                    if over >= 0:
                        break
                    _unescape(buf, pos + 1, after - 1, a8, cbase[data] + clen[data])
                    end_string(a64, cbase, clen, col, data, length)
                else:
                    over = append_string(
                        a64, a8, cbase, ccap, clen, col, data, buf, pos + 1, length
                    )
                    if over >= 0:
                        break
                pos = after
                if op == OP_MAP_KEY:
                    if pos >= end or buf[pos] != 58:  # :
                        over = _GIVE_UP
                        break
                    pos += 1
                pc += 1
            elif op in (OP_LONG, OP_DOUBLE):
                col = code[pc, 1]
                at = clen[col]
                if at >= ccap[col]:
                    over = col
                    break
                if op == OP_LONG:
                    value, after = read_long(buf, pos, end)
                    if after < 0:
                        over = _GIVE_UP
                        break
                    a64[cbase[col] + at] = value
                else:
                    after = pos
                    while after < end and (
                        48 <= buf[after] <= 57 or buf[after] in (43, 45, 46, 69, 101)
                    ):
                        after += 1
                    ok, number = read_double(buf, pos, after, scratch, cell, cell_bits)
                    if not ok:
                        over = _GIVE_UP
                        break
                    f64[cbase[col] + at] = number
                clen[col] = at + 1
                pos = after
                pc += 1
            elif op == OP_NULLABLE:
                if _is(buf, pos, end, 110, 117, 108, 108):  # null
                    pos += 4
                    over = append_pads(
                        pads, code[pc, 2], code[pc, 3], no_symbols, no_data,
                        a64, a32, a8, cbase, ccap, clen,
                    )  # fmt: skip
                    if over >= 0:
                        break
                    pc = code[pc, 4]
                else:
                    over = append_valid(a8, cbase, ccap, clen, code[pc, 1])
                    if over >= 0:
                        break
                    pc += 1
            elif op == OP_OBJECT:
                if pos >= end or buf[pos] != 123:  # {
                    over = _GIVE_UP
                    break
                pos += 1
                stack[sp, 0] = 0
                stack[sp, 1] = 1
                sp += 1
                pc += 1
            elif op == OP_CLOSE:
                if pos >= end or buf[pos] != 125:  # }
                    over = _GIVE_UP
                    break
                pos += 1
                sp -= 1
                pc += 1
            elif op in (OP_TIMESTAMP, OP_DATE, OP_UUID):
                col = code[pc, 1]
                at = clen[col]
                width = 16 if op == OP_UUID else 1
                if at + width > ccap[col]:
                    over = col
                    break
                if op == OP_TIMESTAMP:
                    value, after = _timestamp(buf, pos, end)
                    if after < 0:
                        over = _GIVE_UP
                        break
                    a64[cbase[col] + at] = value
                    pos = after
                elif op == OP_DATE:
                    if pos + 12 > end or buf[pos] != 34 or buf[pos + 11] != 34:
                        over = _GIVE_UP
                        break
                    days = _date(buf, pos + 1)
                    if days == -(10**9):
                        over = _GIVE_UP
                        break
                    a32[cbase[col] + at] = days
                    pos += 12
                else:
                    if pos + 38 > end or buf[pos] != 34 or buf[pos + 37] != 34:
                        over = _GIVE_UP
                        break
                    if read_uuid(buf, pos + 1, 36, a8, cbase[col] + at) != 0:
                        over = _GIVE_UP
                        break
                    pos += 38
                clen[col] = at + width
                pc += 1
            elif op in (OP_LIST, OP_MAP):
                opening = 91 if op == OP_LIST else 123  # [ or {
                closing = opening + 2  # ] or }
                if pos >= end or buf[pos] != opening:
                    over = _GIVE_UP
                    break
                pos += 1
                if pos < end and buf[pos] == closing:
                    pos += 1
                    over = append_offset(a64, cbase, ccap, clen, code[pc, 1], 0)
                    if over >= 0:
                        break
                    pc = code[pc, 2]
                else:
                    stack[sp, 0] = 0
                    stack[sp, 1] = 0
                    sp += 1
                    pc += 1
            elif op in (OP_LIST_NEXT, OP_MAP_NEXT):
                top = sp - 1
                stack[top, 0] += 1
                closing = 93 if op == OP_LIST_NEXT else 125
                if pos < end and buf[pos] == 44:  # ,
                    pos += 1
                    pc = code[pc, 1]
                    continue
                if pos >= end or buf[pos] != closing:
                    over = _GIVE_UP
                    break
                pos += 1
                total = stack[top, 0]
                sp = top
                over = append_offset(a64, cbase, ccap, clen, code[pc, 2], total)
                if over >= 0:
                    break
                if op == OP_MAP_NEXT and total > 1:
                    keys = code[pc, 3]
                    last = clen[keys] - 1
                    if total > flags.size:
                        flags = np.empty(2 * total, dtype=np.uint8)
                    if mark_duplicates(
                        a64, a8, cbase, keys, code[pc, 4], last - total, last, flags
                    ):
                        over = _GIVE_UP  # a Python dict keeps one of them: not canonical
                        break
                pc += 1
            elif op == OP_END:
                break
        failed = not (over == -1 and pos == end)
        over = end_row(
            over, failed, saved, pads, root_pad_first, root_pad_count, no_symbols, no_data,
            a64, a32, a8, cbase, ccap, clen,
        )  # fmt: skip
        if over >= 0:
            return OVERFLOW, row, over
        fallback[row] = 1 if failed else 0
    return DONE, rows, -1
