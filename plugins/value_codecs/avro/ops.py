"""The instruction set shared by the Avro program compiler and its two kernels.

A program is an ``(n, 6)`` int64 array, one instruction per row: the opcode, then up to five
operands. Module-level ints, so numba freezes them into the compiled kernels.

The arenas (``A64``, ``A32``, ``A8``) and the pad kinds are those every program shares
(:mod:`..shared.arena_layout`), re-exported here.

The kernels freeze these numbers when compiled; their caches (``cached_njit``,
:mod:`bergstream.core.kernel_cache`) are keyed on this module's source too.
"""

from __future__ import annotations

from bergstream.plugins.value_codecs.shared.arena_layout import (  # noqa: F401 - re-exported
    A8,
    A32,
    A64,
    PAD_OFF,
    PAD_Z8,
    PAD_Z32,
    PAD_Z64,
)

# Opcodes (operands in columns 1..5 of an instruction).
OP_END = 0  # the record is complete
OP_LONG = 1  # a=col64
OP_INT = 2  # a=col32 (range-checked to int32)
OP_FLOAT = 3  # a=col32 (4 raw bytes)
OP_DOUBLE = 4  # a=col64 (8 raw bytes)
OP_BOOL = 5  # a=col8
OP_STRING = 6  # a=offsets col64, b=data col8, c=1 to check UTF-8 (0 for bytes)
OP_FIXED = 7  # a=col8, b=size
OP_ENUM = 8  # a=offsets col64, b=data col8, c=symbol count, d=first symbol
OP_DEC_BYTES = 9  # a=col64 (2 slots), b=precision
OP_DEC_FIXED = 10  # a=col64 (2 slots), b=size, c=precision
OP_UUID = 11  # a=col8 (16 bytes), from a 36-character string
OP_TIME_MILLIS = 12  # a=col64: an int of milliseconds stored as microseconds
OP_TS_MILLIS = 13  # a=col64: a long of milliseconds stored as microseconds
OP_VALID = 14  # a=validity col8: the value is present
OP_NULLFILL = 15  # a=first pad, b=pad count: the slots of absent values
OP_UNION = 16  # a=branch count, b=first jump-table entry, c=struct validity col8 or -1
OP_JUMP = 17  # a=target
OP_ARRAY = 18  # a=offsets col64, b=pc after the matching OP_NEXT
OP_NEXT = 19  # a=first pc of an item, b=offsets col64, c=map keys offsets (-1: array),
#               d=map keys data col8, e=map dropped-entries col64

# Branch selectors of a union (the encoder picks the branch whose validity is set).
SEL_NULL = -1
SEL_ALWAYS = -2

# Row errors of the decoder (positive) and their causes.
ERR_TRUNCATED = 1
ERR_VARINT = 2
ERR_NEGATIVE_LENGTH = 3
ERR_UNION = 4
ERR_ENUM = 5
ERR_TRAILING = 6
ERR_UTF8 = 7
ERR_INT_RANGE = 8
ERR_TIMESTAMP = 9
ERR_DECIMAL = 10
ERR_UUID = 11
ERR_BLOCK = 12

ERRORS = {
    ERR_TRUNCATED: "corrupt payload: truncated",
    ERR_VARINT: "corrupt payload: a varint longer than 64 bits",
    ERR_NEGATIVE_LENGTH: "corrupt payload: negative length",
    ERR_UNION: "corrupt payload: union branch out of range",
    ERR_ENUM: "corrupt payload: enum symbol out of range",
    ERR_TRAILING: "trailing bytes after the record",
    ERR_UTF8: "invalid UTF-8 in a string",
    ERR_INT_RANGE: "corrupt payload: an int out of the 32-bit range",
    ERR_TIMESTAMP: "value does not fit: timestamp-millis beyond the microsecond range",
    ERR_DECIMAL: "value does not fit: decimal wider than its precision",
    ERR_UUID: "value does not fit: a uuid string that is not a UUID",
    ERR_BLOCK: "corrupt payload: block count larger than the payload",
}

# Encoder failures (the values handed to it are not what the decoder produces).
ENC_UNION = 1
ENC_ENUM = 2
ENC_MILLIS = 3
ENC_INT_RANGE = 4

ENCODE_ERRORS = {
    ENC_UNION: "a union struct with no branch or several branches set",
    ENC_ENUM: "a string that is not a symbol of its enum",
    ENC_MILLIS: "a time or timestamp that is not a whole number of milliseconds",
    ENC_INT_RANGE: "a time-millis value beyond the 32-bit range",
}
