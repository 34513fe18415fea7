"""Vectorized Avro decoding: N payloads of one writer schema into one Arrow array.

The compiled kernel (:mod:`.decode_kernel`) appends every value to columns laid out in three
arenas (int64, int32, uint8), which :class:`~..shared.arena_columns.ArenaColumns` sizes, grows when
the kernel runs out of room, and turns into Arrow arrays without copying them (maps with duplicate
keys lose their earlier entries). Rows the kernel finds undecodable are null with their cause.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from bergstream.core.api import DecodedValues
from bergstream.plugins.value_codecs.avro import ops
from bergstream.plugins.value_codecs.avro.decode_kernel import decode_rows
from bergstream.plugins.value_codecs.avro.program import Program
from bergstream.plugins.value_codecs.shared.arena_columns import (
    ArenaColumns,
    Arenas,
    payload_buffers,
)
from bergstream.plugins.value_codecs.shared.decimal128 import POW10

__all__ = ["AvroDecoder"]


class AvroDecoder:
    """Decodes payloads of one compiled schema into Arrow values of ``arrow_type``."""

    def __init__(self, program: Program, arrow_type: pa.DataType) -> None:
        self.program = program
        self.arrow_type = arrow_type
        self._columns = ArenaColumns(program, arrow_type)

    def decode(self, payloads: pa.Array, skip: int = 0) -> DecodedValues:
        """Decode every payload; failed rows are null with their cause. With ``skip``, each
        value's first ``skip`` bytes are a header that is not decoded (every value has it: the
        caller checked), so framed values need no copy without their framing."""
        data, offsets = payload_buffers(payloads)
        rows = len(offsets) - 1
        keep = np.zeros(rows, dtype=np.uint8)
        errors = np.zeros(rows, dtype=np.int8)
        program = self.program
        stack = np.zeros((program.depth + 1, 2), dtype=np.int64)

        def kernel(start: int, arenas: Arenas) -> tuple[int, int, int]:
            return decode_rows(
                data, offsets, skip, start, program.code, program.jumps, program.pads,
                program.symbol_offsets, program.symbol_data, POW10,
                program.root_pads[0], program.root_pads[1], *arenas.arrays,
                arenas.base, arenas.cap, arenas.length, keep, errors, stack,
            )  # fmt: skip

        values = self._columns.run(offsets, skip, kernel)
        causes: list[str | None] = [None] * rows
        for row in np.flatnonzero(errors):
            causes[row] = ops.ERRORS[int(errors[row])]
        return DecodedValues(values=values, keep_bytes=keep.view(bool), errors=causes)
