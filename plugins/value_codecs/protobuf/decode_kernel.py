"""The fast Protobuf decoder: a numba interpreter of :mod:`.program` programs over the
wire format, and :class:`ProtoFastDecoder`, which runs it over a batch and builds the Arrow
values of the rows it proved canonical.

The kernel accepts a row only when its bytes are exactly what upb's deterministic serialization
of the decoded message gives (so its value is exact and re-encoding gives the bytes back) and
its values need nothing the upb path would flag: the index list is the short ``00``, varints are
minimal, int32 / uint32 / bool values are in range, implicit-presence fields are not their
default, enums name a known value, strings are UTF-8, floats and doubles are not NaN, maps have
at most one entry (measured: upb's deterministic order of several entries is not key order, so
only upb can say whether it holds), timestamps and durations are exact microseconds within
range. Every other row is marked for the upb path (its columns rolled back and filled as a null
row), which gives its value, ``keep_bytes`` and error exactly as before.

Compiled with ``cached_njit`` (:mod:`bergstream.core.kernel_cache`): its on-disk cache is keyed
on the source of this file and of every module it imports, so it is recompiled after any of
them changes.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from bergstream.core.api import cached_njit, read_varint
from bergstream.plugins.value_codecs.protobuf.program import (
    OP_AGAIN,
    OP_BEGIN,
    OP_EMPTY,
    OP_END,
    OP_FIELD,
    OP_FINISH,
    OP_ONEOF,
    OP_PACKED,
    OP_TIME,
    OP_VALID,
    OP_VALUE,
    V_BOOL,
    V_BYTES,
    V_DOUBLE,
    V_FIXED32,
    V_FIXED64,
    V_FLOAT,
    V_INT32,
    V_INT64,
    V_SFIXED32,
    V_SFIXED64,
    V_SINT32,
    V_SINT64,
    V_STRING,
    V_UINT32,
    V_UINT64,
    ProtoProgram,
)
from bergstream.plugins.value_codecs.shared.arena_columns import (
    ArenaColumns,
    Arenas,
    payload_buffers,
)
from bergstream.plugins.value_codecs.shared.arena_kernel import (
    DONE,
    OVERFLOW,
    append_long,
    append_offset,
    append_pads,
    append_string,
    append_valid,
    end_row,
    end_string,
    string_room,
)
from bergstream.plugins.value_codecs.shared.kernel_read import (
    copy_bytes,
    high_bit_set,
    read_le,
    utf8_ok,
)

__all__ = ["DONE", "OVERFLOW", "ProtoFastDecoder", "decode_rows"]

_INT32_MIN = -(2**31)
_INT32_MAX = 2**31 - 1
_UINT32_LIMIT = 2**32
_NANOS = 1_000_000_000
_MAX_SECONDS = (2**63 - 1) // 1_000_000 - 1
_FAIL = -1  # a position: the row is not provably canonical


@cached_njit(nogil=True, inline="always")
def _varint(buf: np.ndarray, pos: int, end: int) -> tuple[int, int]:
    """The unsigned varint at ``pos`` (as int64 bits) and the next position, or ``_FAIL`` if it
    is truncated, longer than 64 bits or not minimal."""
    raw, pos, flags = read_varint(buf, pos, end)
    if pos < 0 or flags != 0:
        return 0, _FAIL
    return raw, pos


@cached_njit(nogil=True, inline="always")
def _match(buf: np.ndarray, pos: int, end: int, tag: int) -> int:
    """The position after ``tag`` if the next field has it (minimal), else -1."""
    if pos >= end:
        return -1
    if tag < 0x80:
        return pos + 1 if buf[pos] == tag else -1
    value, after = _varint(buf, pos, end)
    return after if after >= 0 and value == tag else -1


@cached_njit(nogil=True, inline="always")
def _value(
    conv: int, buf: np.ndarray, pos: int, end: int, implicit: int, col: int, data: int,
    efirst: int, ecount: int, enum_numbers: np.ndarray, symbol_offsets: np.ndarray,
    symbol_data: np.ndarray, a64: np.ndarray, a32: np.ndarray, a8: np.ndarray,
    cbase: np.ndarray, ccap: np.ndarray, clen: np.ndarray,
) -> tuple[int, int]:  # fmt: skip
    """Read one value after its tag and append it: (next position or ``_FAIL``, the column
    that ran out of room or -1)."""
    at = clen[col]
    if conv in (V_STRING, V_BYTES):
        length, pos = _varint(buf, pos, end)
        if pos < 0 or length > end - pos or (implicit == 1 and length == 0):
            return _FAIL, -1
        over = string_room(ccap, clen, col, data, length)
        if over >= 0:
            return pos, over
        # Only strings with a byte above 0x7F need the full UTF-8 check.
        if (
            conv == V_STRING
            and high_bit_set(buf, pos, length)
            and not utf8_ok(buf, pos, pos + length)
        ):
            return _FAIL, -1
        copy_bytes(a8, cbase[data] + clen[data], buf, pos, length)
        end_string(a64, cbase, clen, col, data, length)
        return pos + length, -1
    if conv in (V_FIXED32, V_SFIXED32, V_FLOAT):
        if pos + 4 > end:
            return _FAIL, -1
        bits = read_le(buf, pos, 4)
        if implicit == 1 and bits == 0:
            return _FAIL, -1
        if at >= ccap[col]:
            return pos, col
        if conv == V_FIXED32:
            a64[cbase[col] + at] = bits & 0xFFFFFFFF
        else:
            if conv == V_FLOAT and (bits & 0x7F800000) == 0x7F800000 and (bits & 0x7FFFFF) != 0:
                return _FAIL, -1
            a32[cbase[col] + at] = bits
        clen[col] = at + 1
        return pos + 4, -1
    if conv in (V_FIXED64, V_SFIXED64, V_DOUBLE):
        if pos + 8 > end:
            return _FAIL, -1
        bits = read_le(buf, pos, 8)
        if implicit == 1 and bits == 0:
            return _FAIL, -1
        if conv == V_DOUBLE:
            exponent = (bits >> 52) & 0x7FF
            if exponent == 0x7FF and (bits & 0xFFFFFFFFFFFFF) != 0:
                return _FAIL, -1
        if conv == V_FIXED64:
            if at + 2 > ccap[col]:
                return pos, col
            a64[cbase[col] + at] = bits
            a64[cbase[col] + at + 1] = 0
            clen[col] = at + 2
        else:
            if at >= ccap[col]:
                return pos, col
            a64[cbase[col] + at] = bits
            clen[col] = at + 1
        return pos + 8, -1
    raw, pos = _varint(buf, pos, end)
    if pos < 0 or (implicit == 1 and raw == 0):
        return _FAIL, -1
    if conv == V_INT64:
        if at >= ccap[col]:
            return pos, col
        a64[cbase[col] + at] = raw
        clen[col] = at + 1
    elif conv == V_INT32:
        if raw < _INT32_MIN or raw > _INT32_MAX:
            return _FAIL, -1
        if at >= ccap[col]:
            return pos, col
        a32[cbase[col] + at] = raw
        clen[col] = at + 1
    elif conv in (V_SINT64, V_SINT32):
        if conv == V_SINT32 and (raw < 0 or raw >= _UINT32_LIMIT):
            return _FAIL, -1
        value = ((raw >> 1) & 0x7FFFFFFFFFFFFFFF) ^ -(raw & 1)
        if at >= ccap[col]:
            return pos, col
        if conv == V_SINT64:
            a64[cbase[col] + at] = value
        else:
            a32[cbase[col] + at] = value
        clen[col] = at + 1
    elif conv == V_UINT32:
        if raw < 0 or raw >= _UINT32_LIMIT:
            return _FAIL, -1
        if at >= ccap[col]:
            return pos, col
        a64[cbase[col] + at] = raw
        clen[col] = at + 1
    elif conv == V_UINT64:
        if at + 2 > ccap[col]:
            return pos, col
        a64[cbase[col] + at] = raw
        a64[cbase[col] + at + 1] = 0
        clen[col] = at + 2
    elif conv == V_BOOL:
        if raw > 1 or raw < 0:
            return _FAIL, -1
        if at >= ccap[col]:
            return pos, col
        a8[cbase[col] + at] = raw
        clen[col] = at + 1
    else:  # V_ENUM: a number the enum names
        if raw < _INT32_MIN or raw > _INT32_MAX:
            return _FAIL, -1
        symbol = -1
        for i in range(efirst, efirst + ecount):
            if enum_numbers[i] == raw:
                symbol = i
                break
        if symbol < 0:
            return _FAIL, -1
        start = symbol_offsets[symbol]
        length = symbol_offsets[symbol + 1] - start
        return pos, append_string(a64, a8, cbase, ccap, clen, col, data, symbol_data, start, length)
    return pos, -1


@cached_njit(nogil=True)
def decode_rows(
    buf: np.ndarray, offsets: np.ndarray, skip: int, start_row: int,
    code: np.ndarray, pads: np.ndarray, aux: np.ndarray, enum_numbers: np.ndarray,
    symbol_offsets: np.ndarray, symbol_data: np.ndarray,
    root_pad_first: int, root_pad_count: int,
    a64: np.ndarray, a32: np.ndarray, a8: np.ndarray,
    cbase: np.ndarray, ccap: np.ndarray, clen: np.ndarray,
    slow: np.ndarray, stack: np.ndarray,
) -> tuple[int, int, int]:  # fmt: skip
    """Decode payloads ``start_row..`` (``buf[offsets[i] + skip : offsets[i+1]]``); ``slow[i]``
    set for a row not proved canonical (its columns hold a null row). Returns (status, row,
    column): :data:`DONE`, or :data:`OVERFLOW` with the row to resume at and the column that
    needs room (nothing of that row is kept)."""
    rows = offsets.size - 1
    saved = np.empty(clen.size, dtype=np.int64)
    for row in range(start_row, rows):
        pos = offsets[row] + skip
        end = offsets[row + 1]
        for c in range(clen.size):
            saved[c] = clen[c]
        over = -1
        ok = pos < end and buf[pos] == 0  # the index list [0], short form
        pos += 1
        sp = 0
        pc = 0
        while ok:
            op = code[pc, 0]
            if op == OP_FIELD:
                after = _match(buf, pos, end, code[pc, 1])
                if after >= 0:
                    pos = after
                    if code[pc, 6] == 1:
                        stack[sp] = 0
                        sp += 1
                    pc += 1
                elif code[pc, 3] == 1:
                    ok = False
                else:
                    over = append_pads(
                        pads, code[pc, 4], code[pc, 5], symbol_offsets, symbol_data,
                        a64, a32, a8, cbase, ccap, clen,
                    )  # fmt: skip
                    if over >= 0:
                        break
                    pc = code[pc, 2]
            elif op == OP_VALUE:
                pos, over = _value(
                    code[pc, 1], buf, pos, end, code[pc, 4], code[pc, 2], code[pc, 3],
                    code[pc, 5], code[pc, 6], enum_numbers, symbol_offsets, symbol_data,
                    a64, a32, a8, cbase, ccap, clen,
                )  # fmt: skip
                if over >= 0:
                    break
                if pos < 0:
                    ok = False
                pc += 1
            elif op == OP_VALID:
                over = append_valid(a8, cbase, ccap, clen, code[pc, 1])
                if over >= 0:
                    break
                pc += 1
            elif op == OP_BEGIN:
                length, pos = _varint(buf, pos, end)
                if pos < 0 or length > end - pos:
                    ok = False
                    break
                stack[sp] = end
                sp += 1
                end = pos + length
                pc += 1
            elif op == OP_FINISH:
                if pos != end:
                    ok = False
                    break
                sp -= 1
                end = stack[sp]
                pc += 1
            elif op == OP_AGAIN:
                stack[sp - 1] += 1
                after = _match(buf, pos, end, code[pc, 1])
                if after >= 0:
                    if code[pc, 4] == 1:
                        ok = False
                        break
                    pos = after
                    pc = code[pc, 2]
                    continue
                sp -= 1
                over = append_offset(a64, cbase, ccap, clen, code[pc, 3], stack[sp])
                if over >= 0:
                    break
                pc += 1
            elif op == OP_PACKED:
                length, pos = _varint(buf, pos, end)
                if pos < 0 or length == 0 or length > end - pos:
                    ok = False
                    break
                chunk = pos + length
                count = 0
                while pos < chunk:
                    pos, over = _value(
                        code[pc, 1], buf, pos, chunk, 0, code[pc, 3], code[pc, 4],
                        code[pc, 5], code[pc, 6], enum_numbers, symbol_offsets, symbol_data,
                        a64, a32, a8, cbase, ccap, clen,
                    )  # fmt: skip
                    if over >= 0 or pos < 0:
                        break
                    count += 1
                if over >= 0:
                    break
                if pos != chunk:
                    ok = False
                    break
                over = append_offset(a64, cbase, ccap, clen, code[pc, 2], count)
                if over >= 0:
                    break
                pc += 1
            elif op == OP_TIME:
                length, pos = _varint(buf, pos, end)
                if pos < 0 or length > end - pos:
                    ok = False
                    break
                stop = pos + length
                seconds = 0
                nanos = 0
                if pos < stop and buf[pos] == 0x08:
                    seconds, pos = _varint(buf, pos + 1, stop)
                    if pos < 0 or seconds == 0:
                        ok = False
                        break
                if pos < stop and buf[pos] == 0x10:
                    nanos, pos = _varint(buf, pos + 1, stop)
                    if pos < 0 or nanos == 0 or nanos < _INT32_MIN or nanos > _INT32_MAX:
                        ok = False
                        break
                if pos != stop or nanos % 1000 != 0:
                    ok = False
                    break
                if seconds > _MAX_SECONDS or seconds < -_MAX_SECONDS:
                    ok = False
                    break
                if code[pc, 2] == 1:
                    if nanos >= _NANOS or nanos <= -_NANOS:
                        ok = False
                        break
                    if (seconds > 0 and nanos < 0) or (seconds < 0 and nanos > 0):
                        ok = False
                        break
                elif nanos < 0 or nanos >= _NANOS:
                    ok = False
                    break
                over = append_long(
                    a64, cbase, ccap, clen, code[pc, 1], seconds * 1_000_000 + nanos // 1000
                )
                if over >= 0:
                    break
                pc += 1
            elif op == OP_EMPTY:
                if pos >= end or buf[pos] != 0:
                    ok = False
                    break
                pos += 1
                over = append_valid(a8, cbase, ccap, clen, code[pc, 1])
                if over >= 0:
                    break
                pc += 1
            elif op == OP_ONEOF:
                present = 0
                for i in range(code[pc, 1], code[pc, 1] + code[pc, 2]):
                    col = aux[i]
                    present += a8[cbase[col] + clen[col] - 1]
                if present > 1:
                    ok = False
                    break
                pc += 1
            elif op == OP_END:
                if pos != end:
                    ok = False
                break
        over = end_row(
            over, not ok, saved, pads, root_pad_first, root_pad_count, symbol_offsets,
            symbol_data, a64, a32, a8, cbase, ccap, clen,
        )  # fmt: skip
        if over >= 0:
            return OVERFLOW, row, over
        slow[row] = 0 if ok else 1
    return DONE, rows, -1


class ProtoFastDecoder:
    """Runs a :class:`ProtoProgram` over a batch (arenas sized, grown and assembled by
    :class:`~..shared.arena_columns.ArenaColumns`): the values of the rows it proved canonical, and
    which rows need upb."""

    def __init__(self, program: ProtoProgram, arrow_type: pa.DataType) -> None:
        self.program = program
        self.arrow_type = arrow_type
        self._columns = ArenaColumns(program, arrow_type)

    def decode_fast(self, payloads: pa.Array, skip: int) -> tuple[pa.Array, np.ndarray]:
        """The values of every row (null where not proved canonical) and the rows that were
        not (bool array)."""
        data, offsets = payload_buffers(payloads)
        rows = len(offsets) - 1
        slow = np.zeros(rows, dtype=np.uint8)
        program = self.program
        stack = np.zeros(len(program.code) + 1, dtype=np.int64)  # one push per op at most

        def kernel(start: int, arenas: Arenas) -> tuple[int, int, int]:
            return decode_rows(
                data, offsets, skip, start, program.code, program.pads, program.aux,
                program.enum_numbers, program.symbol_offsets, program.symbol_data,
                program.root_pads[0], program.root_pads[1], *arenas.arrays,
                arenas.base, arenas.cap, arenas.length, slow, stack,
            )  # fmt: skip

        values = self._columns.run(offsets, skip, kernel)
        return values, slow.view(bool)
