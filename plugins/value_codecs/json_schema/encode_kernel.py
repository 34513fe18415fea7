"""The compiled JSON writer (numba): the json-schema codec's canonical text of N values, read
from columns (see :mod:`.encoder` for the columns and the programs).

One interpreter walks the program once per row. Columns are read with one cursor each (slots
consumed in order, as the Avro encoder reads them); a string column's offsets address its data
column. What the kernel does not write (a subnormal double, a date or date-time outside years
1 to 9999, text that is not UTF-8) makes it drop the row's output and set ``fallback[row]``:
the caller writes that row the general way (which raises where it must).

Compiled with ``cached_njit`` (:mod:`bergstream.core.kernel_cache`): its on-disk cache is keyed
on the source of this file and of every module it imports, so it is recompiled after any of
them changes.
"""

from __future__ import annotations

import numpy as np

from bergstream.core.api import cached_njit
from bergstream.plugins.value_codecs.json_schema.number_writing import write_double, write_long
from bergstream.plugins.value_codecs.shared.kernel_read import copy_bytes, load_word, utf8_ok
from bergstream.plugins.value_codecs.shared.kernel_write import put_uuid

__all__ = ["STRING_ROOM", "VALUE_ROOM", "escaped_size", "write_rows"]

# Opcodes: an instruction is a row of 8 int64, the opcode then its operands.
OP_END = 0
OP_OBJECT = 1  # "{" of a struct: pushes a frame (1 while no field is written)
OP_FIELD = 2  # a=validity col8, b=first literal byte, c=literal length, d=1 to leave a null
#               out, e=first pad, f=pad count, g=pc after the field's value
OP_CLOSE = 3  # "}" of a struct: pops its frame
OP_NULLABLE = 4  # a=validity col8, b=first pad, c=pad count, d=pc after the value
OP_LONG = 5  # a=col64
OP_DOUBLE = 6  # a=col64 (float64 bits)
OP_BOOL = 7  # a=col8
OP_STRING = 8  # a=offsets col64, b=data col8: a JSON string
OP_TEXT = 9  # a=offsets col64, b=data col8: JSON text, spliced in as it is
OP_TIMESTAMP = 10  # a=col64 (microseconds since the epoch, UTC)
OP_DATE = 11  # a=col32 (days since the epoch)
OP_UUID = 12  # a=col8 (16 bytes)
OP_LIST = 13  # a=offsets col64, b=pc after the matching OP_LIST_NEXT
OP_LIST_NEXT = 14  # a=first pc of an item
OP_MAP = 15  # a=offsets col64, b=pc after the matching OP_MAP_NEXT
OP_MAP_KEY = 16  # a=keys offsets col64, b=keys data col8
OP_MAP_NEXT = 17  # a=first pc of an entry

# Days from 0001-01-01 and to 9999-12-31 relative to 1970-01-01 (Python's date range).
_MIN_DAYS = -719162
_MAX_DAYS = 2932896
_DAY_MICROS = 86_400_000_000
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_NULL = np.frombuffer(b"null", dtype=np.uint8)
_TRUE = np.frombuffer(b"true", dtype=np.uint8)
_FALSE = np.frombuffer(b"false", dtype=np.uint8)
# Per byte below 0x80: 0 copied as it is, 1 a short escape (its letter in _SHORT), 2 \u00XX.
_ESCAPE = np.zeros(128, dtype=np.uint8)
_ESCAPE[:32] = 2
_SHORT = np.zeros(128, dtype=np.uint8)
for _byte, _letter in ((8, b"b"), (9, b"t"), (10, b"n"), (12, b"f"), (13, b"r"), (34, b'"'),
                       (92, b"\\")):  # fmt: skip
    _ESCAPE[_byte] = 1
    _SHORT[_byte] = _letter[0]
#: Bytes written per byte of a string at most (\u00XX), and for any value but a string
#: (with its comma and quotes or brackets) at most.
STRING_ROOM = 6
VALUE_ROOM = 40
_ROOM = 64  # room checked before each instruction


@cached_njit(nogil=True, inline="always")
def _put(out: np.ndarray, pos: int, text: np.ndarray) -> int:
    for i in range(text.size):
        out[pos + i] = text[i]
    return pos + text.size


@cached_njit(nogil=True, inline="always")
def _two(out: np.ndarray, pos: int, value: int) -> None:
    out[pos] = 48 + value // 10
    out[pos + 1] = 48 + value % 10


@cached_njit(nogil=True)
def _put_date(out: np.ndarray, pos: int, days: int) -> int:
    """``YYYY-MM-DD`` of a day in years 1 to 9999 (H. Hinnant's civil-from-days)."""
    z = days + 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    year = yoe + era * 400 + (1 if month <= 2 else 0)
    _two(out, pos, year // 100)
    _two(out, pos + 2, year % 100)
    out[pos + 4] = 45
    _two(out, pos + 5, month)
    out[pos + 7] = 45
    _two(out, pos + 8, day)
    return pos + 10


_ONES = 0x0101010101010101
_HIGHS = np.int64(-0x7F7F7F7F7F7F7F80)  # 0x80 in every byte
_SPACES = 0x2020202020202020
_QUOTES = 0x2222222222222222
_BACKSLASHES = 0x5C5C5C5C5C5C5C5C


@cached_njit(nogil=True, inline="always")
def _plain_word(word: int) -> bool:
    """Whether none of 8 bytes is below 0x20, a quote, a backslash or above 0x7F."""
    low = (word - _SPACES) & ~word
    quote = word ^ _QUOTES
    backslash = word ^ _BACKSLASHES
    found = low | ((quote - _ONES) & ~quote) | ((backslash - _ONES) & ~backslash) | word
    return found & _HIGHS == 0


@cached_njit(nogil=True)
def _put_string(out: np.ndarray, pos: int, data: np.ndarray, start: int, length: int) -> int:
    """The JSON string of UTF-8 text as ``json.dumps(..., ensure_ascii=False)`` writes it
    (room for ``6 * length + 2`` bytes checked by the caller); -1 if it is not UTF-8."""
    out[pos] = 34
    pos += 1
    end = start + length
    plain = start  # bytes before this one need no escape and are ASCII
    while plain + 8 <= end and _plain_word(load_word(data, plain)):
        plain += 8
    while plain < end and data[plain] < 128 and _ESCAPE[data[plain]] == 0:
        plain += 1
    if plain == end:
        copy_bytes(out, pos, data, start, length)
        out[pos + length] = 34
        return pos + length + 1
    run = start  # the first byte not written yet
    high = False
    for i in range(start, end):
        byte = data[i]
        if byte >= 128:
            high = True
            continue
        kind = _ESCAPE[byte]
        if kind == 0:
            continue
        if i > run:
            copy_bytes(out, pos, data, run, i - run)
            pos += i - run
        run = i + 1
        out[pos] = 92
        if kind == 1:
            out[pos + 1] = _SHORT[byte]
            pos += 2
        else:
            out[pos + 1] = 117
            out[pos + 2] = 48
            out[pos + 3] = 48
            out[pos + 4] = _HEX[byte >> 4]
            out[pos + 5] = _HEX[byte & 15]
            pos += 6
    if high and not utf8_ok(data, start, end):
        return -1
    if end > run:
        copy_bytes(out, pos, data, run, end - run)
        pos += end - run
    out[pos] = 34
    return pos + 1


@cached_njit(nogil=True)
def escaped_size(data: np.ndarray) -> int:
    """The most bytes the JSON strings of ``data``'s bytes take (quotes left out)."""
    size = data.size
    for i in range(data.size):
        byte = data[i]
        if byte < 128 and _ESCAPE[byte] != 0:
            size += 5
    return size


@cached_njit(nogil=True)
def write_rows(
    rows: int, code: np.ndarray, pads: np.ndarray, literals: np.ndarray,
    a64: np.ndarray, a32: np.ndarray, a8: np.ndarray, cbase: np.ndarray,
    stack: np.ndarray, out: np.ndarray, out_offsets: np.ndarray, fallback: np.ndarray,
) -> int:  # fmt: skip
    """Write ``rows`` values into ``out``; ``out_offsets`` gets each one's bounds (a row set
    in ``fallback`` is left empty). Returns -1, or the row that found ``out`` too small (the
    caller sizes it for the worst case: that does not happen)."""
    cpos = np.zeros(cbase.size, dtype=np.int64)
    pos = 0
    out_offsets[0] = 0
    for row in range(rows):
        sp = 0
        pc = 0
        bad = False
        while True:
            op = code[pc, 0]
            if pos + _ROOM > out.size:
                return row
            if op == OP_FIELD:
                valid_col = code[pc, 1]
                present = a8[cbase[valid_col] + cpos[valid_col]] != 0
                cpos[valid_col] += 1
                if not present:
                    for i in range(code[pc, 5], code[pc, 5] + code[pc, 6]):
                        cpos[pads[i, 0]] += pads[i, 1]
                    if code[pc, 4] != 0:
                        pc = code[pc, 7]
                        continue
                length = code[pc, 3]
                if pos + length + _ROOM > out.size:
                    return row
                if stack[sp - 1] != 0:
                    stack[sp - 1] = 0
                else:
                    out[pos] = 44
                    pos += 1
                copy_bytes(out, pos, literals, code[pc, 2], length)
                pos += length
                if present:
                    pc += 1
                else:
                    pos = _put(out, pos, _NULL)
                    pc = code[pc, 7]
            elif op in (OP_STRING, OP_TEXT, OP_MAP_KEY):
                col = code[pc, 1]
                at = cbase[col] + cpos[col]
                cpos[col] += 1
                start = cbase[code[pc, 2]] + a64[at]
                length = a64[at + 1] - a64[at]
                if pos + STRING_ROOM * length + _ROOM > out.size:
                    return row
                if op == OP_TEXT:
                    if not utf8_ok(a8, start, start + length):
                        bad = True
                    copy_bytes(out, pos, a8, start, length)
                    pos += length
                else:
                    end = _put_string(out, pos, a8, start, length)
                    if end < 0:
                        bad = True
                        end = pos
                    pos = end
                    if op == OP_MAP_KEY:
                        out[pos] = 58
                        pos += 1
                pc += 1
            elif op == OP_LONG:
                col = code[pc, 1]
                pos = write_long(out, pos, a64[cbase[col] + cpos[col]])
                cpos[col] += 1
                pc += 1
            elif op == OP_DOUBLE:
                col = code[pc, 1]
                end = write_double(out, pos, a64[cbase[col] + cpos[col]])
                cpos[col] += 1
                if end < 0:
                    bad = True
                else:
                    pos = end
                pc += 1
            elif op == OP_OBJECT:
                out[pos] = 123
                pos += 1
                stack[sp] = 1
                sp += 1
                pc += 1
            elif op == OP_CLOSE:
                out[pos] = 125
                pos += 1
                sp -= 1
                pc += 1
            elif op == OP_NULLABLE:
                valid_col = code[pc, 1]
                present = a8[cbase[valid_col] + cpos[valid_col]] != 0
                cpos[valid_col] += 1
                if present:
                    pc += 1
                else:
                    for i in range(code[pc, 2], code[pc, 2] + code[pc, 3]):
                        cpos[pads[i, 0]] += pads[i, 1]
                    pos = _put(out, pos, _NULL)
                    pc = code[pc, 4]
            elif op == OP_BOOL:
                col = code[pc, 1]
                pos = _put(out, pos, _TRUE if a8[cbase[col] + cpos[col]] != 0 else _FALSE)
                cpos[col] += 1
                pc += 1
            elif op == OP_TIMESTAMP:
                col = code[pc, 1]
                micros = a64[cbase[col] + cpos[col]]
                cpos[col] += 1
                days = micros // _DAY_MICROS
                if days < _MIN_DAYS or days > _MAX_DAYS:
                    bad = True
                else:
                    rest = micros - days * _DAY_MICROS
                    seconds = rest // 1_000_000
                    fraction = rest - seconds * 1_000_000
                    out[pos] = 34
                    pos = _put_date(out, pos + 1, days)
                    out[pos] = 84
                    _two(out, pos + 1, seconds // 3600)
                    out[pos + 3] = 58
                    _two(out, pos + 4, (seconds // 60) % 60)
                    out[pos + 6] = 58
                    _two(out, pos + 7, seconds % 60)
                    pos += 9
                    if fraction != 0:
                        out[pos] = 46
                        for i in range(6):
                            out[pos + 6 - i] = 48 + fraction % 10
                            fraction //= 10
                        pos += 7
                    out[pos] = 90
                    out[pos + 1] = 34
                    pos += 2
                pc += 1
            elif op == OP_DATE:
                col = code[pc, 1]
                days = np.int64(a32[cbase[col] + cpos[col]])
                cpos[col] += 1
                if days < _MIN_DAYS or days > _MAX_DAYS:
                    bad = True
                else:
                    out[pos] = 34
                    pos = _put_date(out, pos + 1, days)
                    out[pos] = 34
                    pos += 1
                pc += 1
            elif op == OP_UUID:
                col = code[pc, 1]
                at = cbase[col] + cpos[col]
                cpos[col] += 16
                out[pos] = 34
                pos = put_uuid(out, pos + 1, a8, at)
                out[pos] = 34
                pos += 1
                pc += 1
            elif op in (OP_LIST, OP_MAP):
                col = code[pc, 1]
                at = cbase[col] + cpos[col]
                cpos[col] += 1
                count = a64[at + 1] - a64[at]
                out[pos] = 91 if op == OP_LIST else 123
                pos += 1
                if count == 0:
                    out[pos] = 93 if op == OP_LIST else 125
                    pos += 1
                    pc = code[pc, 2]
                else:
                    stack[sp] = count
                    sp += 1
                    pc += 1
            elif op in (OP_LIST_NEXT, OP_MAP_NEXT):
                top = sp - 1
                stack[top] -= 1
                if stack[top] > 0:
                    out[pos] = 44
                    pos += 1
                    pc = code[pc, 1]
                else:
                    out[pos] = 93 if op == OP_LIST_NEXT else 125
                    pos += 1
                    sp = top
                    pc += 1
            else:  # OP_END
                break
        if bad:
            pos = out_offsets[row]
            fallback[row] = 1
        out_offsets[row + 1] = pos
    return -1
