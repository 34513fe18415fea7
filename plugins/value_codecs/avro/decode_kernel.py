"""The compiled Avro decoder (numba): one generic interpreter of :mod:`.ops` programs,
compiled once for every schema, walking N payloads and appending to column arenas.

Per row it checks everything that makes a payload undecodable (a positive error code: the row's
columns are rolled back and filled with the null row) and everything that makes its canonical
re-encoding differ from it (``keep`` set, values kept): non-minimal varints, booleans other than
0 and 1, arrays and maps in several blocks or with negative counts, duplicate map keys (the last
wins; earlier entries go to the map's dropped-entries column), decimals not in fastavro's
length, uuids not in their lowercase 36-character form. A column running out of room stops the
walk before that row (status :data:`OVERFLOW`), so the caller grows the arena and resumes there.

Compiled with ``cached_njit`` (:mod:`bergstream.core.kernel_cache`): its on-disk cache is keyed
on the source of this file and of every module it imports, so it is recompiled after any of
them changes.
"""

from __future__ import annotations

import numpy as np

from bergstream.core.api import cached_njit, read_varint, unzigzag, varint_too_long
from bergstream.plugins.value_codecs.avro.ops import (
    ERR_BLOCK,
    ERR_DECIMAL,
    ERR_ENUM,
    ERR_INT_RANGE,
    ERR_NEGATIVE_LENGTH,
    ERR_TIMESTAMP,
    ERR_TRAILING,
    ERR_TRUNCATED,
    ERR_UNION,
    ERR_UTF8,
    ERR_UUID,
    ERR_VARINT,
    OP_ARRAY,
    OP_BOOL,
    OP_DEC_BYTES,
    OP_DEC_FIXED,
    OP_DOUBLE,
    OP_END,
    OP_ENUM,
    OP_FIXED,
    OP_FLOAT,
    OP_INT,
    OP_JUMP,
    OP_LONG,
    OP_NEXT,
    OP_NULLFILL,
    OP_STRING,
    OP_TIME_MILLIS,
    OP_TS_MILLIS,
    OP_UNION,
    OP_UUID,
    OP_VALID,
)
from bergstream.plugins.value_codecs.shared.arena_kernel import (
    DONE,
    OVERFLOW,
    append_long,
    append_offset,
    append_pads,
    append_string,
    end_row,
)
from bergstream.plugins.value_codecs.shared.decimal128 import decimal_length, fits_precision
from bergstream.plugins.value_codecs.shared.kernel_read import (
    high_bit_set,
    mark_duplicates,
    read_be128,
    read_le,
    read_uuid,
    utf8_ok,
)

__all__ = ["DONE", "OVERFLOW", "decode_rows"]

_INT32_MIN = -(2**31)
_INT32_MAX = 2**31 - 1
_MILLIS_LIMIT = (2**63 - 1) // 1000
_OVERLONG = 1  # core's VARINT_OVERLONG
_OVERFLOW = 2  # core's VARINT_OVERFLOW


@cached_njit(nogil=True, inline="always")
def _read_long(buf: np.ndarray, pos: int, end: int) -> tuple[int, int, bool]:
    """The zigzag varint (an Avro int or long) at ``pos``: value, next position (``-code`` on
    error: :data:`ERR_TRUNCATED`, :data:`ERR_VARINT` beyond 64 bits), whether its encoding
    is longer than needed."""
    raw, after, flags = read_varint(buf, pos, end)
    if after < 0:
        return 0, -ERR_VARINT if varint_too_long(pos, end) else -ERR_TRUNCATED, False
    if flags & _OVERFLOW:
        return 0, -ERR_VARINT, False
    return unzigzag(raw), after, (flags & _OVERLONG) != 0


@cached_njit(nogil=True)
def decode_rows(
    buf: np.ndarray, offsets: np.ndarray, skip: int, start_row: int,
    code: np.ndarray, jumps: np.ndarray, pads: np.ndarray,
    symbol_offsets: np.ndarray, symbol_data: np.ndarray, pow10: np.ndarray,
    root_pad_first: int, root_pad_count: int,
    a64: np.ndarray, a32: np.ndarray, a8: np.ndarray,
    cbase: np.ndarray, ccap: np.ndarray, clen: np.ndarray,
    keep: np.ndarray, errors: np.ndarray, stack: np.ndarray,
) -> tuple[int, int, int]:  # fmt: skip
    """Decode payloads ``start_row..`` (``buf[offsets[i] + skip : offsets[i+1]]``: ``skip``
    bytes of each value are a header, framing the caller checked is there). Returns (status,
    row, column): :data:`DONE`, or :data:`OVERFLOW` with the row to resume at and the column
    that needs room (nothing of that row is kept)."""
    rows = offsets.size - 1
    saved = np.empty(clen.size, dtype=np.int64)
    flags = np.empty(64, dtype=np.uint8)
    for row in range(start_row, rows):
        pos = offsets[row] + skip
        end = offsets[row + 1]
        for c in range(clen.size):
            saved[c] = clen[c]
        error = 0
        over = -1
        odd = False
        sp = 0
        pc = 0
        while True:
            op = code[pc, 0]
            if op in (OP_LONG, OP_INT, OP_TIME_MILLIS, OP_TS_MILLIS):
                value, pos, f = _read_long(buf, pos, end)
                if pos < 0:
                    error = -pos
                    break
                odd |= f
                col = code[pc, 1]
                at = clen[col]
                if at >= ccap[col]:
                    over = col
                    break
                if op == OP_LONG:
                    a64[cbase[col] + at] = value
                elif op == OP_TS_MILLIS:
                    if value > _MILLIS_LIMIT or value < -_MILLIS_LIMIT:
                        error = ERR_TIMESTAMP
                        break
                    a64[cbase[col] + at] = value * 1000
                else:
                    if value < _INT32_MIN or value > _INT32_MAX:
                        error = ERR_INT_RANGE
                        break
                    if op == OP_INT:
                        a32[cbase[col] + at] = value
                    else:
                        a64[cbase[col] + at] = value * 1000
                clen[col] = at + 1
                pc += 1
            elif op in (OP_STRING, OP_ENUM, OP_UUID, OP_DEC_BYTES):
                value, pos, f = _read_long(buf, pos, end)
                if pos < 0:
                    error = -pos
                    break
                odd |= f
                if op == OP_ENUM:
                    count = code[pc, 3]
                    if value < 0 or value >= count:
                        error = ERR_ENUM
                        break
                    symbol = code[pc, 4] + value
                    start = symbol_offsets[symbol]
                    length = symbol_offsets[symbol + 1] - start
                    source = symbol_data
                else:
                    if value < 0:
                        error = ERR_NEGATIVE_LENGTH
                        break
                    if value > end - pos:
                        error = ERR_TRUNCATED
                        break
                    start = pos
                    length = value
                    source = buf
                    pos += length
                col = code[pc, 1]
                if op == OP_UUID:
                    at = clen[col]
                    if at + 16 > ccap[col]:
                        over = col
                        break
                    form = read_uuid(buf, start, length, a8, cbase[col] + at)
                    if form < 0:
                        error = ERR_UUID
                        break
                    odd |= form > 0
                    clen[col] = at + 16
                elif op == OP_DEC_BYTES:
                    high, low, fits = read_be128(buf, start, length)
                    if not fits or not fits_precision(high, low, code[pc, 2], pow10):
                        error = ERR_DECIMAL
                        break
                    odd |= length != decimal_length(high, low)
                    at = clen[col]
                    if at + 2 > ccap[col]:
                        over = col
                        break
                    a64[cbase[col] + at] = low
                    a64[cbase[col] + at + 1] = high
                    clen[col] = at + 2
                else:
                    over = append_string(
                        a64, a8, cbase, ccap, clen, col, code[pc, 2], source, start, length
                    )
                    if over >= 0:
                        break
                    # Only strings with a byte above 0x7F need the full UTF-8 check (a bad one
                    # is an error: the row's columns are rolled back, the string with them).
                    if (
                        op == OP_STRING
                        and code[pc, 3] == 1
                        and high_bit_set(buf, start, length)
                        and not utf8_ok(buf, start, pos)
                    ):
                        error = ERR_UTF8
                        break
                pc += 1
            elif op in (OP_DOUBLE, OP_FLOAT):
                size = 8 if op == OP_DOUBLE else 4
                if pos + size > end:
                    error = ERR_TRUNCATED
                    break
                col = code[pc, 1]
                at = clen[col]
                if at >= ccap[col]:
                    over = col
                    break
                if op == OP_DOUBLE:
                    a64[cbase[col] + at] = read_le(buf, pos, 8)
                else:
                    a32[cbase[col] + at] = read_le(buf, pos, 4)
                clen[col] = at + 1
                pos += size
                pc += 1
            elif op in (OP_VALID, OP_BOOL):
                col = code[pc, 1]
                at = clen[col]
                if at >= ccap[col]:
                    over = col
                    break
                if op == OP_VALID:
                    a8[cbase[col] + at] = 1
                else:
                    if pos >= end:
                        error = ERR_TRUNCATED
                        break
                    byte = buf[pos]
                    pos += 1
                    odd |= byte > 1
                    a8[cbase[col] + at] = 1 if byte != 0 else 0
                clen[col] = at + 1
                pc += 1
            elif op == OP_UNION:
                value, pos, f = _read_long(buf, pos, end)
                if pos < 0:
                    error = -pos
                    break
                odd |= f
                if value < 0 or value >= code[pc, 1]:
                    error = ERR_UNION
                    break
                pc = jumps[code[pc, 2] + value]
            elif op == OP_JUMP:
                pc = code[pc, 1]
            elif op == OP_NULLFILL:
                over = append_pads(
                    pads, code[pc, 1], code[pc, 2], symbol_offsets, symbol_data,
                    a64, a32, a8, cbase, ccap, clen,
                )  # fmt: skip
                if over >= 0:
                    break
                pc += 1
            elif op in (OP_FIXED, OP_DEC_FIXED):
                size = code[pc, 2]
                if pos + size > end:
                    error = ERR_TRUNCATED
                    break
                col = code[pc, 1]
                at = clen[col]
                if op == OP_FIXED:
                    if at + size > ccap[col]:
                        over = col
                        break
                    dst = cbase[col] + at
                    for i in range(size):
                        a8[dst + i] = buf[pos + i]
                    clen[col] = at + size
                else:
                    high, low, fits = read_be128(buf, pos, size)
                    if not fits or not fits_precision(high, low, code[pc, 3], pow10):
                        error = ERR_DECIMAL
                        break
                    if at + 2 > ccap[col]:
                        over = col
                        break
                    a64[cbase[col] + at] = low
                    a64[cbase[col] + at + 1] = high
                    clen[col] = at + 2
                pos += size
                pc += 1
            elif op == OP_ARRAY:
                count, pos, f = _read_long(buf, pos, end)
                if pos < 0:
                    error = -pos
                    break
                odd |= f
                if count < 0:
                    count = -count
                    odd = True
                    _, pos, f = _read_long(buf, pos, end)  # the block's size in bytes
                    if pos < 0:
                        error = -pos
                        break
                    if count < 0:
                        error = ERR_BLOCK
                        break
                if count > end - pos:  # every item takes at least one byte
                    error = ERR_BLOCK
                    break
                if count == 0:
                    over = append_offset(a64, cbase, ccap, clen, code[pc, 1], 0)
                    if over >= 0:
                        break
                    pc = code[pc, 2]
                else:
                    stack[sp, 0] = count
                    stack[sp, 1] = 0
                    sp += 1
                    pc += 1
            elif op == OP_NEXT:
                top = sp - 1
                stack[top, 0] -= 1
                stack[top, 1] += 1
                if stack[top, 0] > 0:
                    pc = code[pc, 1]
                    continue
                count, pos, f = _read_long(buf, pos, end)
                if pos < 0:
                    error = -pos
                    break
                odd |= f
                if count != 0:
                    odd = True
                    if count < 0:
                        count = -count
                        _, pos, f = _read_long(buf, pos, end)
                        if pos < 0:
                            error = -pos
                            break
                        if count < 0:
                            error = ERR_BLOCK
                            break
                    if count > end - pos:
                        error = ERR_BLOCK
                        break
                    stack[top, 0] = count
                    pc = code[pc, 1]
                    continue
                total = stack[top, 1]
                sp = top
                over = append_offset(a64, cbase, ccap, clen, code[pc, 2], total)
                if over >= 0:
                    break
                keys = code[pc, 3]
                if keys >= 0 and total > 1:
                    last = clen[keys] - 1
                    if total > flags.size:
                        flags = np.empty(2 * total, dtype=np.uint8)
                    if mark_duplicates(
                        a64, a8, cbase, keys, code[pc, 4], last - total, last, flags
                    ):
                        odd = True
                        drops = code[pc, 5]
                        for j in range(total):
                            if flags[j] == 1:
                                over = append_long(a64, cbase, ccap, clen, drops, last - total + j)
                                if over >= 0:
                                    break
                        if over >= 0:
                            break
                pc += 1
            elif op == OP_END:
                break
        if error == 0 and pos != end:
            error = ERR_TRAILING
        over = end_row(
            over, error != 0, saved, pads, root_pad_first, root_pad_count, symbol_offsets,
            symbol_data, a64, a32, a8, cbase, ccap, clen,
        )  # fmt: skip
        if over >= 0:
            return OVERFLOW, row, over
        keep[row] = 1 if odd or error != 0 else 0
        errors[row] = error
    return DONE, rows, -1
