"""The payment's Avro schema in the stack's Schema Registry, and the codec that writes and reads
payment values as Confluent-framed Avro (magic byte 0, the 4-byte schema id, the payload).

The codec is the one ``bergstream run`` and the pipeline use for the topic: found through the
quickstart config's ``codecs:`` rule and the plugin registry (a plugin package may not import
another), so the values the demo writes are encoded by the same compiled loops that decode them,
a whole chunk of payments at a time.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from bergstream.core.api import (
    BergstreamConfig,
    RegisteredSchema,
    SchemaReference,
    SchemaRegistryClient,
    ServiceContext,
    TopicCodecsResolver,
    ValueCodec,
    arrow_type,
    frame_payloads,
    load_registry,
    split_framing,
)

__all__ = [
    "CURRENCIES",
    "METHODS",
    "PAYMENT_SCHEMA",
    "DecodedPayments",
    "PaymentCodec",
    "PaymentFields",
    "SchemaRegistrationError",
    "register_schema",
]

CURRENCIES = ("EUR", "USD", "GBP", "CHF", "SEK")
METHODS = ("card", "sepa", "wallet")
_SCALE = 2  # amount is a decimal with two digits after the point: cents

#: The value schema of the ``payments`` topic: ``amount`` is an exact decimal, ``currency`` and
#: ``method`` enums (string columns), ``paid_at`` a timestamp (timestamptz column).
PAYMENT_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "Payment",
    "namespace": "io.bergstream.quickstart",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "customer", "type": "long"},
        {
            "name": "amount",
            "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": _SCALE},
        },
        {"name": "currency", "type": {"type": "enum", "name": "Currency", "symbols": CURRENCIES}},
        {"name": "method", "type": {"type": "enum", "name": "Method", "symbols": METHODS}},
        {"name": "paid_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}

_CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


class SchemaRegistrationError(RuntimeError):
    """The Schema Registry refused the schema, or did not answer."""


@dataclass(frozen=True)
class PaymentFields:
    """The fields of one payment value (``amount`` in cents, ``paid_at`` in epoch ms)."""

    id: str
    customer: int
    amount_cents: int
    currency: str
    method: str
    paid_at_ms: int


@dataclass(frozen=True)
class DecodedPayments:
    """Values read back: the decoded payments (one row per value that decoded) and how many
    values were not this schema's (other or no framing) or did not decode."""

    payments: pa.StructArray
    other_schema: int
    undecodable: int


def register_schema(registry_url: str, subject: str, schema: str, timeout: float = 10.0) -> int:
    """Register ``schema`` (Avro text) under ``subject`` with the Confluent REST API
    (``POST /subjects/{subject}/versions``); returns its schema id (the existing id when the
    subject already has this schema)."""
    quoted = urllib.parse.quote(subject, safe="")
    url = f"{registry_url.rstrip('/')}/subjects/{quoted}/versions"
    body = json.dumps({"schema": schema, "schemaType": "AVRO"}).encode()
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={"Content-Type": _CONTENT_TYPE, "Accept": _CONTENT_TYPE},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            registered = json.loads(answer.read())
    except urllib.error.HTTPError as error:
        detail = error.read().decode(errors="replace")[:300]
        raise SchemaRegistrationError(
            f"the Schema Registry refused the schema of subject {subject} (HTTP {error.code}): "
            f"{detail}"
        ) from None
    except (urllib.error.URLError, OSError) as error:
        raise SchemaRegistrationError(
            f"the Schema Registry at {url} did not answer: {error}"
        ) from None
    schema_id = registered.get("id") if isinstance(registered, dict) else None
    if not isinstance(schema_id, int):
        raise SchemaRegistrationError(f"POST {url} answered {registered!r}, not a schema id")
    return schema_id


def _no_references(reference: SchemaReference) -> RegisteredSchema:
    raise SchemaRegistrationError(
        f"the payment schema has no references, yet {reference} was asked"
    )


class PaymentCodec:
    """Payment values as Confluent-framed Avro of one registered schema (registered under
    ``subject`` when known)."""

    def __init__(
        self, schema: RegisteredSchema, codec: ValueCodec, subject: str | None = None
    ) -> None:
        self.schema = schema
        self.codec = codec
        self.subject = subject
        struct = arrow_type(codec.iceberg_type(schema, _no_references))
        assert isinstance(struct, pa.StructType)
        self._fields = [struct.field(i) for i in range(struct.num_fields)]

    @classmethod
    def register(cls, config: BergstreamConfig, topic: str, home: Path) -> PaymentCodec:
        """Register :data:`PAYMENT_SCHEMA` under the value subject that ``config``'s ``codecs:``
        rule gives ``topic``, in its Schema Registry, and take the codec that rule reads the
        schema with (raises :class:`SchemaRegistrationError` when the rule leaves the topic raw
        or no codec reads Avro)."""
        resolver = TopicCodecsResolver(ServiceContext(config, load_registry(), home))
        codecs = resolver.for_topic(topic)
        client = resolver.registry_client
        if codecs is None or codecs.value is None or client is None:
            raise SchemaRegistrationError(
                f"the config's codecs: section leaves topic {topic} raw: no typed columns"
            )
        subject = codecs.value.subject
        schema_id = register_schema(client.settings.url, subject, json.dumps(PAYMENT_SCHEMA))
        codec = cls.from_registry(client, schema_id, codecs.value.codec_for)
        codec.subject = subject
        return codec

    @classmethod
    def from_registry(
        cls,
        client: SchemaRegistryClient,
        schema_id: int,
        codec_for: Callable[[RegisteredSchema], ValueCodec | None],
    ) -> PaymentCodec:
        """The codec of schema ``schema_id`` as the registry returns it; ``codec_for`` maps a
        schema to the codec reading its type (``SideCodecs.codec_for``)."""
        schema = client.schema_by_id(schema_id)
        codec = codec_for(schema)
        if codec is None:
            raise SchemaRegistrationError(
                f"no installed value codec reads {schema.schema_type} schemas (schema id "
                f"{schema_id})"
            )
        return cls(schema, codec)

    @property
    def schema_id(self) -> int:
        """The registry's id of the schema, written in every value's framing."""
        return self.schema.schema_id

    def columns(self, payments: Sequence[PaymentFields]) -> pa.StructArray:
        """``payments`` as the Arrow struct the codec encodes."""
        count = len(payments)
        cents = np.fromiter((p.amount_cents for p in payments), np.int64, count)
        # decimal128 values are 16-byte little-endian two's complement integers of cents
        unscaled = np.empty((count, 2), np.int64)
        unscaled[:, 0] = cents
        unscaled[:, 1] = cents >> 63
        paid_at_us = np.fromiter((p.paid_at_ms for p in payments), np.int64, count) * 1000
        by_name = {
            "id": pa.array([p.id for p in payments], pa.large_string()),
            "customer": pa.array(
                np.fromiter((p.customer for p in payments), np.int64, count), pa.int64()
            ),
            "amount": pa.Array.from_buffers(
                self._field("amount").type, count, [None, pa.py_buffer(unscaled)]
            ),
            "currency": pa.array([p.currency for p in payments], pa.large_string()),
            "method": pa.array([p.method for p in payments], pa.large_string()),
            "paid_at": pa.array(paid_at_us, self._field("paid_at").type),
        }
        return pa.StructArray.from_arrays(
            [by_name[field.name].cast(field.type) for field in self._fields], fields=self._fields
        )

    def encode(self, payments: Sequence[PaymentFields]) -> list[bytes]:
        """The framed Avro values of ``payments``, in order."""
        if not payments:
            return []
        payloads = self.codec.encode(self.schema, self.columns(payments))
        framed: list[bytes] = frame_payloads(self.schema_id, payloads).to_pylist()
        return framed

    def decode(self, values: Sequence[bytes]) -> DecodedPayments:
        """Decode ``values`` (framed by this schema's id) in one batch."""
        array = pa.array(values, pa.large_binary())
        framed, ids = split_framing(array)
        ours = framed & (ids == self.schema_id)
        payloads = [value[5:] for value, mine in zip(values, ours, strict=True) if mine]
        decoded = self.codec.decode(self.schema, pa.array(payloads, pa.large_binary()))
        ok = np.array([error is None for error in decoded.errors], dtype=bool)
        payments = decoded.values.filter(pa.array(ok))
        assert isinstance(payments, pa.StructArray)
        return DecodedPayments(
            payments=payments,
            other_schema=int(len(values) - ours.sum()),
            undecodable=int((~ok).sum()),
        )

    def _field(self, name: str) -> pa.Field:
        return next(field for field in self._fields if field.name == name)
