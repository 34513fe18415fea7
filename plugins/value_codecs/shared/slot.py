"""The slot tree of a compiled program: which arena columns hold each Arrow array of a decoded
value. The Avro, JSON Schema and Protobuf programs all describe their values with it, so one
assembler (:mod:`.arena_assembly`) builds Arrow from the arenas of any of them."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Slot"]


@dataclass(eq=False)
class Slot:
    """One Arrow array of the decoded value and the columns holding it.

    ``kind``: struct, list, map, string, binary, int32, int64, float32, float64, bool, decimal,
    fixed or uuid. ``col`` is the values column (the offsets column of string, binary, list and
    map), ``data`` the bytes of string and binary, ``width`` the slots per value (bytes of
    fixed and uuid, 2 for decimal), ``drops`` the dropped entries (duplicate keys) of a map.
    """

    kind: str
    valid: int = -1
    col: int = -1
    data: int = -1
    width: int = 1
    drops: int = -1
    children: list[Slot] = field(default_factory=list)
