"""Arrow arrays over the columns of finished arenas (:mod:`.arena_columns`), without copying
values: offsets, data and fixed-width columns become Arrow buffers as they are; validity and
booleans are packed into bitmaps (an all-valid value gets no bitmap); map offsets become int32,
and a map's entries listed in its dropped-entries column (earlier entries of a repeated key)
are filtered out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from bergstream.plugins.value_codecs.shared.slot import Slot

if TYPE_CHECKING:
    from bergstream.plugins.value_codecs.shared.arena_columns import Arenas

__all__ = ["ArrowAssembler"]


class ArrowAssembler:
    """Arrow arrays over the columns of finished arenas (no copy of values)."""

    def __init__(self, arenas: Arenas) -> None:
        self.arenas = arenas

    def column(self, col: int, slots: int) -> np.ndarray:
        """The first ``slots`` slots of column ``col`` (a view into its arena)."""
        base = int(self.arenas.base[col])
        return self.arenas.arrays[int(self.arenas.arena[col])][base : base + slots]

    def build(self, slot: Slot, type_: pa.DataType, length: int) -> pa.Array:
        """The array of ``length`` values of ``type_`` held in the columns of ``slot``."""
        validity, nulls = self.validity(slot, length)
        kind = slot.kind
        if kind == "struct":
            children = [
                self.build(child, type_.field(i).type, length)
                for i, child in enumerate(slot.children)
            ]
            return pa.Array.from_buffers(type_, length, [validity], nulls, children=children)
        if kind in ("list", "map"):
            offsets = self.column(slot.col, length + 1)
            size = int(offsets[-1])
            if kind == "list":
                child = self.build(slot.children[0], type_.value_type, size)
                buffers = [validity, pa.py_buffer(offsets)]
                return pa.Array.from_buffers(type_, length, buffers, nulls, children=[child])
            return self.map(slot, type_, length, offsets, validity, nulls)
        if kind in ("string", "binary"):
            offsets = self.column(slot.col, length + 1)
            data = self.column(slot.data, int(offsets[-1]) if length else 0)
            buffers = [validity, pa.py_buffer(offsets), pa.py_buffer(data)]
            return pa.Array.from_buffers(type_, length, buffers, nulls)
        values = self.column(slot.col, length * slot.width)
        if kind == "bool":
            values = np.packbits(values, bitorder="little")
        if kind == "uuid":
            storage_type = type_.storage_type if isinstance(type_, pa.ExtensionType) else type_
            storage = pa.Array.from_buffers(
                storage_type, length, [validity, pa.py_buffer(values)], nulls
            )
            if isinstance(type_, pa.ExtensionType):
                return pa.ExtensionArray.from_storage(type_, storage)
            return storage
        return pa.Array.from_buffers(type_, length, [validity, pa.py_buffer(values)], nulls)

    def map(
        self, slot: Slot, type_: pa.MapType, length: int, offsets: np.ndarray,
        validity: pa.Buffer | None, nulls: int,
    ) -> pa.Array:  # fmt: skip
        """The map array of ``slot`` (its entries' ``offsets`` already read), without the
        entries its dropped-entries column lists."""
        size = int(offsets[-1])
        keys = self.build(slot.children[0], type_.key_type, size)
        items = self.build(slot.children[1], type_.item_type, size)
        entries = pa.StructArray.from_arrays(
            [keys, items], fields=[type_.key_field, type_.item_field]
        )
        dropped = self.column(slot.drops, int(self.arenas.length[slot.drops]))
        if dropped.size:
            kept = np.ones(size, dtype=bool)
            kept[dropped] = False
            entries = entries.filter(pa.array(kept))
            before = np.concatenate([[0], np.cumsum(kept)])
            offsets = before[offsets]
        buffers = [validity, pa.py_buffer(offsets.astype(np.int32))]
        return pa.Array.from_buffers(type_, length, buffers, nulls, children=[entries])

    def validity(self, slot: Slot, length: int) -> tuple[pa.Buffer | None, int]:
        """The validity bitmap of ``slot``'s ``length`` values (None when all are valid) and
        their null count."""
        if slot.valid < 0 or length == 0:
            return None, 0
        flags = self.column(slot.valid, length)
        nulls = length - int(np.count_nonzero(flags))
        if nulls == 0:
            return None, 0
        return pa.py_buffer(np.packbits(flags, bitorder="little")), nulls
