"""The compiled Avro encoder (numba): the decoder's program run backwards, reading columns and
writing canonical Avro (minimal varints, one block per non-empty array or map, fastavro's
decimal lengths, lowercase uuids), one payload per row.

Columns are read with one cursor each (slots consumed in order); a string or binary column's
offsets address its data column. A value the decoder could not have produced (a union struct
with no branch set, a string that is no symbol of its enum, a timestamp-millis with a
sub-millisecond part) stops the walk with a positive status (:data:`.ops.ENCODE_ERRORS`).

Compiled with ``cached_njit`` (:mod:`bergstream.core.kernel_cache`): its on-disk cache is keyed
on the source of this file and of every module it imports, so it is recompiled after any of
them changes.
"""

from __future__ import annotations

import numpy as np

from bergstream.core.api import cached_njit, put_zigzag
from bergstream.plugins.value_codecs.avro.ops import (
    ENC_ENUM,
    ENC_INT_RANGE,
    ENC_MILLIS,
    ENC_UNION,
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
    SEL_ALWAYS,
    SEL_NULL,
)
from bergstream.plugins.value_codecs.shared.decimal128 import decimal_length
from bergstream.plugins.value_codecs.shared.kernel_read import copy_bytes
from bergstream.plugins.value_codecs.shared.kernel_write import grow, put_le, put_uuid

__all__ = ["encode_rows"]

_INT32_MIN = -(2**31)
_INT32_MAX = 2**31 - 1


@cached_njit(nogil=True, inline="always")
def _put_be128(out: np.ndarray, pos: int, high: int, low: int, size: int) -> int:
    """The ``size`` low bytes of the sign-extended 128-bit value, big-endian."""
    fill = 0xFF if high < 0 else 0
    for i in range(size):
        shift = size - 1 - i
        if shift < 8:
            out[pos + i] = (low >> (8 * shift)) & 0xFF
        elif shift < 16:
            out[pos + i] = (high >> (8 * (shift - 8))) & 0xFF
        else:
            out[pos + i] = fill
    return pos + size


@cached_njit(nogil=True)
def _symbol(
    a8: np.ndarray, start: int, length: int, symbol_offsets: np.ndarray,
    symbol_data: np.ndarray, first: int, count: int,
) -> int:  # fmt: skip
    """The index of the enum symbol equal to ``a8[start:start+length]``, or -1."""
    for k in range(count):
        s = symbol_offsets[first + k]
        if symbol_offsets[first + k + 1] - s != length:
            continue
        same = True
        for i in range(length):
            if symbol_data[s + i] != a8[start + i]:
                same = False
                break
        if same:
            return k
    return -1


@cached_njit(nogil=True)
def encode_rows(
    rows: int, code: np.ndarray, jumps: np.ndarray, selectors: np.ndarray, pads: np.ndarray,
    symbol_offsets: np.ndarray, symbol_data: np.ndarray,
    a64: np.ndarray, a32: np.ndarray, a8: np.ndarray, cbase: np.ndarray,
    stack: np.ndarray, out: np.ndarray, out_offsets: np.ndarray,
) -> tuple[int, int, np.ndarray]:  # fmt: skip
    """Encode ``rows`` values. Returns (status, row, output bytes): status 0, or an encoder
    error of that row; ``out_offsets`` gets each payload's bounds in the output."""
    cpos = np.zeros(cbase.size, dtype=np.int64)
    pos = 0
    out_offsets[0] = 0
    for row in range(rows):
        sp = 0
        pc = 0
        while True:
            op = code[pc, 0]
            if pos + 20 > out.size:
                out = grow(out, pos, pos + 20)
            if op in (OP_LONG, OP_TS_MILLIS, OP_TIME_MILLIS):
                col = code[pc, 1]
                value = a64[cbase[col] + cpos[col]]
                cpos[col] += 1
                if op != OP_LONG:
                    if value % 1000 != 0:
                        return ENC_MILLIS, row, out
                    value //= 1000
                    if op == OP_TIME_MILLIS and (value < _INT32_MIN or value > _INT32_MAX):
                        return ENC_INT_RANGE, row, out
                pos = put_zigzag(out, pos, value)
                pc += 1
            elif op in (OP_STRING, OP_ENUM):
                col = code[pc, 1]
                at = cbase[col] + cpos[col]
                cpos[col] += 1
                start = cbase[code[pc, 2]] + a64[at]
                length = a64[at + 1] - a64[at]
                if op == OP_ENUM:
                    k = _symbol(a8, start, length, symbol_offsets, symbol_data, code[pc, 4],
                                code[pc, 3])  # fmt: skip
                    if k < 0:
                        return ENC_ENUM, row, out
                    pos = put_zigzag(out, pos, k)
                else:
                    if pos + 10 + length > out.size:
                        out = grow(out, pos, pos + 10 + length)
                    pos = put_zigzag(out, pos, length)
                    copy_bytes(out, pos, a8, start, length)
                    pos += length
                pc += 1
            elif op == OP_INT:
                col = code[pc, 1]
                pos = put_zigzag(out, pos, np.int64(a32[cbase[col] + cpos[col]]))
                cpos[col] += 1
                pc += 1
            elif op == OP_DOUBLE:
                col = code[pc, 1]
                pos = put_le(out, pos, a64[cbase[col] + cpos[col]], 8)
                cpos[col] += 1
                pc += 1
            elif op == OP_FLOAT:
                col = code[pc, 1]
                pos = put_le(out, pos, np.int64(a32[cbase[col] + cpos[col]]), 4)
                cpos[col] += 1
                pc += 1
            elif op == OP_BOOL:
                col = code[pc, 1]
                out[pos] = 1 if a8[cbase[col] + cpos[col]] != 0 else 0
                pos += 1
                cpos[col] += 1
                pc += 1
            elif op == OP_VALID:
                cpos[code[pc, 1]] += 1
                pc += 1
            elif op == OP_NULLFILL:
                for i in range(code[pc, 1], code[pc, 1] + code[pc, 2]):
                    cpos[pads[i, 1]] += pads[i, 2]
                pc += 1
            elif op == OP_UNION:
                count = code[pc, 1]
                base = code[pc, 2]
                struct_valid = code[pc, 3]
                absent = struct_valid >= 0 and a8[cbase[struct_valid] + cpos[struct_valid]] == 0
                chosen = -1
                null_branch = -1
                for k in range(count):
                    sel = selectors[base + k]
                    if sel == SEL_NULL:
                        if null_branch < 0:
                            null_branch = k
                    elif sel == SEL_ALWAYS:
                        chosen = k
                    elif not absent and a8[cbase[sel] + cpos[sel]] != 0:
                        if chosen >= 0:
                            return ENC_UNION, row, out
                        chosen = k
                if absent or (chosen < 0 and struct_valid < 0):
                    chosen = null_branch
                if chosen < 0:
                    return ENC_UNION, row, out
                pos = put_zigzag(out, pos, chosen)
                pc = jumps[base + chosen]
            elif op == OP_JUMP:
                pc = code[pc, 1]
            elif op in (OP_FIXED, OP_UUID):
                col = code[pc, 1]
                at = cbase[col] + cpos[col]
                if op == OP_FIXED:
                    size = code[pc, 2]
                    if pos + size > out.size:
                        out = grow(out, pos, pos + size)
                    for i in range(size):
                        out[pos + i] = a8[at + i]
                    pos += size
                else:
                    size = 16
                    if pos + 37 > out.size:
                        out = grow(out, pos, pos + 37)
                    out[pos] = 72  # zigzag 36
                    pos = put_uuid(out, pos + 1, a8, at)
                cpos[col] += size
                pc += 1
            elif op in (OP_DEC_BYTES, OP_DEC_FIXED):
                col = code[pc, 1]
                at = cbase[col] + cpos[col]
                low = a64[at]
                high = a64[at + 1]
                cpos[col] += 2
                if op == OP_DEC_BYTES:
                    size = decimal_length(high, low)
                    pos = put_zigzag(out, pos, size)
                else:
                    size = code[pc, 2]
                if pos + size > out.size:
                    out = grow(out, pos, pos + size)
                pos = _put_be128(out, pos, high, low, size)
                pc += 1
            elif op == OP_ARRAY:
                col = code[pc, 1]
                at = cbase[col] + cpos[col]
                cpos[col] += 1
                count = a64[at + 1] - a64[at]
                pos = put_zigzag(out, pos, count)
                if count == 0:
                    pc = code[pc, 2]
                else:
                    stack[sp, 0] = count
                    sp += 1
                    pc += 1
            elif op == OP_NEXT:
                top = sp - 1
                stack[top, 0] -= 1
                if stack[top, 0] > 0:
                    pc = code[pc, 1]
                else:
                    out[pos] = 0
                    pos += 1
                    sp = top
                    pc += 1
            elif op == OP_END:
                break
        out_offsets[row + 1] = pos
    return 0, rows, out
