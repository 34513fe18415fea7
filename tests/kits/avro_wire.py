"""Avro values for the typed KSI and pipeline tests: schemas of two versions, deterministic values,
and an Avro binary writer of the test's own that writes the canonical form (what fastavro writes) or
legal non-canonical forms of the same value (padded varints, arrays and maps in several blocks or
with negative block counts, decimals with a redundant sign byte), plus framing helpers."""

from __future__ import annotations

import datetime as dt
import io
import json
import random
import struct
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import fastavro

CURRENCIES = ["EUR", "USD", "JPY"]
AMOUNT = {"precision": 12, "scale": 2}
EPOCH_2024 = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)

#: Version 1 of the value schema: most Avro types and logical types.
PAYMENT_V1: dict[str, Any] = {
    "type": "record",
    "name": "Payment",
    "namespace": "ksi.test",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "qty", "type": "int"},
        {"name": "currency", "type": {"type": "enum", "name": "Currency", "symbols": CURRENCIES}},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", **AMOUNT}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "rate", "type": "double"},
        {"name": "ratio", "type": "float"},
        {"name": "ok", "type": "boolean"},
        {"name": "blob", "type": "bytes"},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "attrs", "type": {"type": "map", "values": "long"}},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "choice", "type": ["int", "string"]},
        {
            "name": "origin",
            "type": {
                "type": "record",
                "name": "Origin",
                "fields": [
                    {"name": "country", "type": "string"},
                    {"name": "zip", "type": ["null", "int"], "default": None},
                ],
            },
        },
        {"name": "digest", "type": {"type": "fixed", "name": "Digest", "size": 4}},
    ],
}  # fmt: skip


def payment_v2() -> dict[str, Any]:
    """Version 2: ``qty`` int -> long, a new optional top-level field and a new nested one."""
    schema = json.loads(json.dumps(PAYMENT_V1))
    fields = schema["fields"]
    next(f for f in fields if f["name"] == "qty")["type"] = "long"
    origin = next(f for f in fields if f["name"] == "origin")["type"]
    origin["fields"].append({"name": "city", "type": ["null", "string"], "default": None})
    fields.append({"name": "channel", "type": ["null", "string"], "default": None})
    return schema


#: The key schema: a plain string (one column ``key``).
KEY_SCHEMA: dict[str, Any] = {"type": "string"}


def payment(index: int, version: int = 1) -> dict[str, Any]:
    """A deterministic value of the given schema version (fastavro's Python form)."""
    rng = random.Random(index)
    value: dict[str, Any] = {
        "id": rng.randrange(-(2**62), 2**62),
        "qty": rng.randrange(-(2**31), 2**31),
        "currency": rng.choice(["EUR", "USD", "JPY"]),
        "amount": Decimal(rng.randrange(-(10**11), 10**11)).scaleb(-2),
        "at": EPOCH_2024 + dt.timedelta(milliseconds=rng.randrange(10**11)),
        "day": dt.date(2000, 1, 1) + dt.timedelta(days=rng.randrange(20000)),
        "rate": rng.random() * 1000,
        "ratio": struct.unpack("<f", struct.pack("<f", rng.random()))[0],
        "ok": rng.random() < 0.5,
        "blob": rng.randbytes(rng.randrange(0, 12)),
        "tags": [f"t{rng.randrange(100)}" for _ in range(rng.randrange(0, 5))],
        "attrs": {f"a{i}": rng.randrange(-1000, 1000) for i in range(rng.randrange(0, 4))},
        "note": None if rng.random() < 0.4 else f"note {index} ✓",
        "choice": rng.randrange(1000) if rng.random() < 0.5 else f"c{index}",
        "origin": {"country": rng.choice(["DE", "FR", "JP"]), "zip": None if index % 3 else index},
        "digest": rng.randbytes(4),
    }  # fmt: skip
    if version >= 2:
        value["qty"] = rng.randrange(-(2**62), 2**62)
        value["origin"]["city"] = None if index % 2 else f"city{index}"
        value["channel"] = None if index % 5 == 0 else rng.choice(["web", "pos"])
    return value


def canonical(schema: dict[str, Any] | str, value: Any) -> bytes:
    """fastavro's encoding of ``value`` (the canonical one)."""
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), value)
    return out.getvalue()


def framed(schema_id: int, payload: bytes) -> bytes:
    """Confluent framing: magic byte 0, the schema id (big-endian int32), the payload."""
    return b"\x00" + schema_id.to_bytes(4, "big", signed=True) + payload


# --------------------------------------------------------------------------- a quirky writer


@dataclass(frozen=True)
class Quirks:
    """Legal Avro encodings that are not the canonical one."""

    pad_varints: bool = False  # one redundant 0x80 continuation byte per varint
    block_size: int | None = None  # arrays and maps in blocks of this many items
    negative_blocks: bool = False  # block counts negative, followed by the block's byte size
    decimal_sign_byte: bool = False  # a redundant leading 0x00 / 0xFF on decimals


def _varint(number: int, quirks: Quirks) -> bytes:
    zigzag = (number << 1) ^ (number >> 63)
    out = bytearray()
    while True:
        byte = zigzag & 0x7F
        zigzag >>= 7
        if zigzag:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            break
    if quirks.pad_varints:
        out[-1] |= 0x80
        out.append(0)
    return bytes(out)


def _decimal_bytes(value: Decimal, scale: int, quirks: Quirks) -> bytes:
    unscaled = int(value.scaleb(scale))
    length = max(1, (unscaled.bit_length() + 8) // 8)
    data = unscaled.to_bytes(length, "big", signed=True)
    if quirks.decimal_sign_byte:
        data = (b"\xff" if unscaled < 0 else b"\x00") + data
    return data


def _blocks(items: list[Any], write: Any, quirks: Quirks) -> bytes:
    out = bytearray()
    size = quirks.block_size or max(len(items), 1)
    for start in range(0, len(items), size):
        chunk = items[start : start + size]
        body = b"".join(write(item) for item in chunk)
        if quirks.negative_blocks:
            out += _varint(-len(chunk), quirks) + _varint(len(body), quirks)
        else:
            out += _varint(len(chunk), quirks)
        out += body
    out += _varint(0, quirks)
    return bytes(out)


def _epoch_ms(value: dt.datetime) -> int:
    delta = value - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    return delta.days * 86_400_000 + delta.seconds * 1000 + delta.microseconds // 1000


def write(schema: Any, value: Any, quirks: Quirks, named: dict[str, Any] | None = None) -> bytes:
    """``value`` in Avro binary per ``schema`` (a subset: what the schemas above use)."""
    named = {} if named is None else named
    if isinstance(schema, str):
        schema = named.get(schema, {"type": schema})
    if isinstance(schema, list):
        for index, branch in enumerate(schema):
            if _fits(branch, value, named):
                return _varint(index, quirks) + write(branch, value, quirks, named)
        raise ValueError(f"no branch of {schema} takes {value!r}")
    kind = schema["type"]
    logical = schema.get("logicalType")
    if kind == "record":
        named[schema["name"]] = schema
        return b"".join(write(f["type"], value[f["name"]], quirks, named) for f in schema["fields"])
    if kind == "enum":
        named[schema["name"]] = schema
        return _varint(schema["symbols"].index(value), quirks)
    if kind == "fixed":
        named[schema["name"]] = schema
        return bytes(value)
    if kind == "array":
        return _blocks(value, lambda item: write(schema["items"], item, quirks, named), quirks)
    if kind == "map":
        return _blocks(
            list(value.items()),
            lambda kv: (
                write("string", kv[0], quirks, named)
                + write(schema["values"], kv[1], quirks, named)
            ),
            quirks,
        )
    if logical == "decimal":
        data = _decimal_bytes(value, schema["scale"], quirks)
        return _varint(len(data), quirks) + data
    if logical == "timestamp-millis":
        return _varint(_epoch_ms(value), quirks)
    if logical == "date":
        return _varint((value - dt.date(1970, 1, 1)).days, quirks)
    if kind in ("int", "long"):
        return _varint(value, quirks)
    if kind == "boolean":
        return b"\x01" if value else b"\x00"
    if kind == "float":
        return struct.pack("<f", value)
    if kind == "double":
        return struct.pack("<d", value)
    if kind in ("bytes", "string"):
        data = value.encode() if isinstance(value, str) else bytes(value)
        return _varint(len(data), quirks) + data
    if kind == "null":
        return b""
    raise ValueError(f"the test writer does not know {schema}")


def _fits(branch: Any, value: Any, named: dict[str, Any]) -> bool:
    name = branch if isinstance(branch, str) else branch.get("type")
    checks = {
        "null": value is None,
        "int": isinstance(value, int) and not isinstance(value, bool),
        "long": isinstance(value, int) and not isinstance(value, bool),
        "string": isinstance(value, str),
        "boolean": isinstance(value, bool),
        "double": isinstance(value, float),
    }
    if name in checks:
        return checks[name]
    return name in named and isinstance(value, dict)


#: The quirk sets a test cycles through (each gives bytes differing from the canonical ones).
QUIRKS = (
    Quirks(pad_varints=True),
    Quirks(block_size=1),
    Quirks(block_size=2, negative_blocks=True),
    Quirks(decimal_sign_byte=True),
)


def noncanonical(schema: dict[str, Any] | str, value: Any, index: int) -> bytes:
    """A legal encoding of ``value`` that differs from the canonical one (quirks tried from
    ``index`` on)."""
    reference = canonical(schema, value)
    for step in range(len(QUIRKS)):
        data = write(schema, value, QUIRKS[(index + step) % len(QUIRKS)])
        if data != reference:
            return data
    raise AssertionError("every quirk gave the canonical bytes")


#: Cases of :func:`value_bytes` by ``index % 16``.
CANONICAL_CASES = range(9)


def value_bytes(
    index: int,
    schema_id: int,
    version: int,
    serialize: Any = None,
) -> bytes | None:
    """The value of record ``index``: mostly canonical (``serialize(value)`` when given, e.g. a
    confluent-kafka AvroSerializer, else fastavro plus framing), and every 16 records one of each
    other kind: two non-canonical, a tombstone, an empty value, an unframed value, an unknown
    schema id, trailing bytes, a truncated payload."""
    schema = PAYMENT_V1 if version == 1 else payment_v2()
    value = payment(index, version)
    kind = index % 16
    body = canonical(schema, value)
    if kind in CANONICAL_CASES:
        return serialize(value) if serialize is not None else framed(schema_id, body)
    return {
        9: lambda: framed(schema_id, noncanonical(schema, value, index)),
        10: lambda: framed(schema_id, noncanonical(schema, value, index + 1)),
        11: lambda: None,
        12: lambda: b"",
        13: lambda: f"plain {index}".encode(),
        14: lambda: framed(999_999, body),
        15: lambda: framed(schema_id, body + b"\x00" if index % 32 < 16 else body[:-3]),
    }[kind]()  # fmt: skip


def key_bytes(index: int, schema_id: int | None, serialize: Any = None) -> bytes | None:
    """The key of record ``index``: with ``schema_id`` an Avro string key (canonical, padded
    varint, unframed, null or empty by ``index % 8``), else plain bytes or null."""
    text = f"key-{index}"
    kind = index % 8
    if kind == 5:
        return None
    if kind == 6:
        return b""
    if schema_id is None or kind == 7:
        return text.encode()
    if kind == 4:
        return framed(schema_id, write(KEY_SCHEMA, text, Quirks(pad_varints=True)))
    if serialize is not None:
        return serialize(text)  # type: ignore[no-any-return]
    return framed(schema_id, canonical(KEY_SCHEMA, text))
