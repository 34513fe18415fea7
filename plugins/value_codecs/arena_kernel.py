"""What the compiled decoders' kernels (numba) share about column arenas: the status a walk over
a batch ends with, and appending the slots of absent values (the pad table of
:mod:`.avro_ops`: kind, column, slot count per row).

:func:`append_pads` is called from the kernels of :mod:`.decode_kernel` and :mod:`.json_kernel`,
and the statuses are frozen into those and :mod:`.protobuf_kernel`; their on-disk numba caches
are keyed on their own files only: after changing this module, touch those three files too so
they are recompiled.
"""

from __future__ import annotations

import numba
import numpy as np

from bergstream.plugins.value_codecs.avro_ops import PAD_OFF, PAD_Z8, PAD_Z32, PAD_Z64

__all__ = ["DONE", "OVERFLOW", "append_pads"]

#: The kernel walked every row.
DONE = 0
#: A column ran out of room: the kernel stopped before a row (nothing of it kept), so the caller
#: grows the arenas and resumes there.
OVERFLOW = 1


@numba.njit(cache=True, nogil=True)
def append_pads(
    pads: np.ndarray, first: int, count: int, a64: np.ndarray, a32: np.ndarray, a8: np.ndarray,
    cbase: np.ndarray, ccap: np.ndarray, clen: np.ndarray,
) -> int:  # fmt: skip
    """Append the slots of absent values (pads ``first .. first + count - 1``) to their columns
    (base ``cbase``, capacity ``ccap``, length ``clen`` in slots); -1, or the column that ran
    out of room."""
    for i in range(first, first + count):
        kind = pads[i, 0]
        col = pads[i, 1]
        slots = pads[i, 2]
        at = clen[col]
        if at + slots > ccap[col]:
            return col
        where = cbase[col] + at
        if kind == PAD_OFF:
            a64[where] = a64[where - 1]
        elif kind == PAD_Z64:
            for s in range(slots):
                a64[where + s] = 0
        elif kind == PAD_Z32:
            a32[where] = 0
        elif kind == PAD_Z8:
            for s in range(slots):
                a8[where + s] = 0
        clen[col] = at + slots
    return -1
