"""The 20-field record the JSON Schema and Protobuf benchmarks share, in each format.

A record (strings, longs, doubles, a timestamp, a decimal as a string, a nullable note; about
300 bytes of data) with its registry schema and Confluent-framed values:

- **json-schema**: a registry ``JSON`` schema (the timestamp a ``format: date-time`` string,
  written ``YYYY-MM-DDTHH:MM:SSZ``); each value is the codec's canonical text, the compact
  ``json.dumps(..., separators=(",", ":"), ensure_ascii=False)`` with keys in schema order;
- **protobuf**: a registry ``PROTOBUF`` schema in ``.proto`` text (the timestamp a
  ``google.protobuf.Timestamp``); each value is the message index ``00`` then the message's
  deterministic serialization (the message class comes from the codec's own schema loader,
  which compiles the text with grpcio-tools' protoc);
- **json** (plain JSON, no registry; :func:`plain_json_payloads`): the json-schema format's
  texts without framing, which the ``json`` codec groups into shapes (the nullable note makes
  two). Not in :data:`FORMATS`: it has no registry schema.

Every value is canonical: the codec decodes it and encodes it back to the same bytes.

Benchmarks run as scripts (``python bench/NAME.py``), so this module is imported from bench/.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from bergstream.core.api import RegisteredSchema, ValueCodec
from bergstream.plugins.value_codecs.json_schema.codec import JsonSchemaCodec
from bergstream.plugins.value_codecs.protobuf.codec import ProtobufCodec
from bergstream.plugins.value_codecs.protobuf.schema import (
    build_pool,
    load_proto_schema,
    message_at,
    root_file,
)

FIRST_AT = 1_763_000_000  # seconds

STRINGS = [f"s{i}" for i in range(6)]
LONGS = [f"l{i}" for i in range(6)]
DOUBLES = [f"d{i}" for i in range(5)]

JSON_SCHEMA: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "Wide",
    "type": "object",
    "properties": {
        **{name: {"type": "string"} for name in STRINGS},
        **{name: {"type": "integer"} for name in LONGS},
        **{name: {"type": "number"} for name in DOUBLES},
        "at": {"type": "string", "format": "date-time"},
        "price": {"type": "string"},
        "note": {"type": ["string", "null"]},
    },
    "required": [*STRINGS, *LONGS, *DOUBLES, "at", "price", "note"],
}

PROTO = "\n".join(
    [
        'syntax = "proto3";',
        "package bergstream.bench;",
        'import "google/protobuf/timestamp.proto";',
        "",
        "message Wide {",
        *(f"  string {name} = {n};" for n, name in enumerate(STRINGS, 1)),
        *(f"  int64 {name} = {n};" for n, name in enumerate(LONGS, 7)),
        *(f"  double {name} = {n};" for n, name in enumerate(DOUBLES, 13)),
        "  google.protobuf.Timestamp at = 18;",
        "  string price = 19;",
        "  optional string note = 20;",
        "}",
        "",
    ]
)


def value(i: int) -> dict[str, Any]:
    """Record ``i``, as the Avro bench's (``at`` in whole seconds, ``price`` a Decimal)."""
    out: dict[str, Any] = {
        name: f"text-{k}-{i % 997:05d}-" + "x" * (20 + (i + k) % 15)
        for k, name in enumerate(STRINGS)
    }
    out.update({name: i * 1_000_003 + k for k, name in enumerate(LONGS)})
    out.update({name: i / (k + 1.5) for k, name in enumerate(DOUBLES)})
    out["at"] = FIRST_AT + i
    out["price"] = decimal.Decimal(i % 100_000) / 100
    out["note"] = None if i % 3 else f"note {i}"
    return out


def framed(schema_id: int, payload: bytes) -> bytes:
    """``payload`` behind Confluent framing (magic byte 0, the 4-byte schema id)."""
    return b"\x00" + schema_id.to_bytes(4, "big") + payload


def json_text(i: int) -> bytes:
    """Record ``i`` as compact JSON text (keys in schema order, the timestamp a date-time
    string, the price a decimal string)."""
    row = value(i)
    row["at"] = dt.datetime.fromtimestamp(row["at"], dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    row["price"] = str(row["price"])
    return json.dumps(row, separators=(",", ":"), ensure_ascii=False).encode()


def json_payloads(schema: RegisteredSchema, count: int) -> list[bytes]:
    """Framed canonical JSON texts of records ``0 .. count - 1``."""
    return [framed(schema.schema_id, json_text(i)) for i in range(count)]


def plain_json_payloads(count: int) -> list[bytes]:
    """Unframed compact JSON texts of records ``0 .. count - 1`` (the ``json`` codec's)."""
    return [json_text(i) for i in range(count)]


def message_class(schema: RegisteredSchema) -> type[Message]:
    """The ``Wide`` message class, compiled from ``schema`` by the codec's own loader."""
    descriptor = message_at(root_file(build_pool(load_proto_schema(schema, None))), [0])
    assert descriptor is not None
    return GetMessageClass(descriptor)


def protobuf_payloads(schema: RegisteredSchema, count: int) -> list[bytes]:
    """Framed deterministic serializations (message index ``00``) of records
    ``0 .. count - 1``."""
    wide = message_class(schema)
    payloads = []
    for i in range(count):
        row = value(i)
        at, price, note = row.pop("at"), row.pop("price"), row.pop("note")
        message: Any = wide(**row, price=str(price))
        message.at.seconds = at
        if note is not None:
            message.note = note
        payloads.append(
            framed(schema.schema_id, b"\x00" + message.SerializeToString(deterministic=True))
        )
    return payloads


@dataclass(frozen=True)
class RecordFormat:
    """One format of the record: its registry schema type and text, a fresh codec reading it,
    and its framed values."""

    name: str
    schema_type: str
    text: str
    codec: Callable[[], ValueCodec]
    #: the framed values of records ``0 .. count - 1`` under the given schema
    build: Callable[[RegisteredSchema, int], list[bytes]]

    def registered(self, schema_id: int, subject: str) -> RegisteredSchema:
        """The schema as the registry gives it back: ``schema_id``, version 1 of ``subject``."""
        return RegisteredSchema(schema_id, self.schema_type, self.text, subject=subject, version=1)

    def payloads(self, schema: RegisteredSchema, count: int) -> list[bytes]:
        """The framed values of records ``0 .. count - 1`` under ``schema``."""
        return self.build(schema, count)


FORMATS: dict[str, RecordFormat] = {
    "json-schema": RecordFormat(
        "json-schema", "JSON", json.dumps(JSON_SCHEMA), JsonSchemaCodec, json_payloads
    ),
    "protobuf": RecordFormat("protobuf", "PROTOBUF", PROTO, ProtobufCodec, protobuf_payloads),
}


def register_schema(registry_url: str, subject: str, text: str, schema_type: str) -> int:
    """Register ``text`` (of ``schema_type``: AVRO, JSON or PROTOBUF) under ``subject`` in the
    registry at ``registry_url``; its id."""
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    client = SchemaRegistryClient({"url": registry_url})
    return int(client.register_schema(subject, Schema(text, schema_type)))
