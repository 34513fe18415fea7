"""The column arenas and pad kinds every compiled program shares (Avro, JSON Schema, Protobuf).

Columns live in three arenas by element type: :data:`A64` (int64: longs, timestamps, doubles as
raw bits, decimals as (low, high) pairs, offsets), :data:`A32` (int32: ints, dates, floats as
raw bits) and :data:`A8` (uint8: validity, booleans, fixed bytes, string data).

A pad (a row of a program's pad table: kind, column, slot count, and for :data:`PAD_SYM` the
data column and symbol) fills the slots of an absent value; :func:`.arena_kernel.append_pads`
interprets them. Module-level ints, so numba freezes them into the compiled kernels.
"""

from __future__ import annotations

__all__ = ["A8", "A32", "A64", "PAD_OFF", "PAD_SYM", "PAD_Z8", "PAD_Z32", "PAD_Z64"]

# Arenas.
A64 = 0
A32 = 1
A8 = 2

# Pad kinds.
PAD_Z64 = 0  # zeros in an int64 column
PAD_Z32 = 1  # a zero in an int32 column
PAD_Z8 = 2  # zeros in a uint8 column
PAD_OFF = 3  # repeat the last offset (an empty string or list)
#: An absent enum's default symbol (Protobuf only: :mod:`..protobuf.program`, whose pad table
#: rows are kind, column, data column, symbol).
PAD_SYM = 4
