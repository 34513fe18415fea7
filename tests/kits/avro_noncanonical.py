"""A test-only Avro writer that takes the liberties the specification allows, drawn by
hypothesis: varints longer than needed, booleans other than 0 and 1, arrays and maps split in
several blocks or with negative counts, map keys written twice (the later entry wins), decimals
with a redundant sign byte, uuids in the other forms Python reads (uppercase, no hyphens,
braces, ``urn:uuid:``). It says whether it took any (the payload is then not canonical).
Values are in fastavro's writer form, as :func:`.avro_gen.values_of` draws them.
"""

from __future__ import annotations

import decimal
import struct
from typing import Any

from hypothesis import strategies as st

from bergstream.plugins.value_codecs.avro.schema import AvroNode
from tests.kits.avro_gen import values_of

_WIDE = decimal.Context(prec=80)


class LiberalWriter:
    """Writes one value; :attr:`odd` tells whether the bytes are non-canonical."""

    def __init__(self, draw: st.DrawFn) -> None:
        self.draw = draw
        self.odd = False
        self.out = bytearray()

    def chance(self) -> bool:
        return self.draw(st.integers(0, 5)) == 0

    def varint(self, value: int) -> None:
        raw = ((value << 1) ^ (value >> 63)) & ((1 << 64) - 1)
        data = bytearray()
        while raw >= 0x80:
            data.append((raw & 0x7F) | 0x80)
            raw >>= 7
        data.append(raw)
        extra = 10 - len(data)
        if extra > 0 and self.chance():
            data[-1] |= 0x80
            data.extend([0x80] * (self.draw(st.integers(1, extra)) - 1) + [0x00])
            self.odd = True
        self.out += data

    def write(self, node: AvroNode, value: Any) -> None:
        if node.kind == "union":
            if value is None:
                index = next(i for i, b in enumerate(node.branches) if b.kind == "null")
                self.varint(index)
                return
            tag, inner = value
            index = next(i for i, b in enumerate(node.branches) if (b.name or b.kind) == tag)
            self.varint(index)
            self.write(node.branches[index], inner)
            return
        if node.logical == "decimal":
            self.decimal(node, value)
        elif node.logical == "uuid" and node.kind == "string":
            text = str(value)
            if self.chance():
                forms = [text.upper(), value.hex, "{" + text + "}", "urn:uuid:" + text]
                text = self.draw(st.sampled_from(forms))
                self.odd |= text != str(value)
            self.bytes(text.encode())
        elif node.kind == "null":
            return
        elif node.kind == "boolean":
            byte = 1 if value else 0
            if value and self.chance():
                byte = self.draw(st.integers(2, 255))
                self.odd = True
            self.out.append(byte)
        elif node.kind in ("int", "long"):
            self.varint(value)
        elif node.kind == "float":
            self.out += struct.pack("<f", value)
        elif node.kind == "double":
            self.out += struct.pack("<d", value)
        elif node.kind in ("bytes", "string"):
            self.bytes(value.encode() if isinstance(value, str) else value)
        elif node.kind == "fixed":
            self.out += value
        elif node.kind == "enum":
            self.varint(node.symbols.index(value))
        elif node.kind == "array":
            self.blocks(node.items, list(value), None)
        elif node.kind == "map":
            entries = list(value.items())
            if entries and self.chance():  # a key written twice: the later entry wins
                key = self.draw(st.sampled_from([k for k, _ in entries]))
                position = next(i for i, (k, _) in enumerate(entries) if k == key)
                earlier = self.draw(values_of(node.items))
                entries.insert(self.draw(st.integers(0, position)), (key, earlier))
                self.odd = True
            self.blocks(node.items, entries, "map")
        else:
            for name, child in node.fields:
                self.write(child, value[name])

    def bytes(self, data: bytes) -> None:
        self.varint(len(data))
        self.out += data

    def decimal(self, node: AvroNode, value: decimal.Decimal) -> None:
        unscaled = int(value.scaleb(node.scale, _WIDE))
        if node.kind == "fixed":
            self.out += unscaled.to_bytes(node.size, "big", signed=True)
            return
        data = unscaled.to_bytes((abs(unscaled).bit_length() + 8) // 8, "big", signed=True)
        if self.chance():
            data = (b"\xff" if unscaled < 0 else b"\x00") + data
            self.odd = True
        self.bytes(data)

    def blocks(self, items: AvroNode, entries: list[Any], kind: str | None) -> None:
        """Entries in one or more blocks, some maybe with a negative count and byte size."""
        start = 0
        while start < len(entries):
            size = len(entries) - start
            if self.chance():
                size = self.draw(st.integers(1, size))
            negative = self.chance()
            self.odd |= negative or start > 0
            body = LiberalWriter(self.draw)
            for entry in entries[start : start + size]:
                if kind == "map":
                    body.bytes(entry[0].encode())
                    body.write(items, entry[1])
                else:
                    body.write(items, entry)
            self.odd |= body.odd
            if negative:
                self.varint(-size)
                self.varint(len(body.out))
            else:
                self.varint(size)
            self.out += body.out
            start += size
        self.varint(0)
