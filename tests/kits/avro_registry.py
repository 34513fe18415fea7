"""Helpers of ISK's and the pipeline's typed-table tests: Avro values produced with
confluent-kafka's ``AvroSerializer`` through the stack's Schema Registry, records that do not
decode, and the ``codecs:`` section (as a service context, or as YAML for ``bergstream run``)."""

from __future__ import annotations

import copy
import datetime as dt
import json
import textwrap
from pathlib import Path
from typing import Any

from bergstream.core.api import BergstreamConfig, ServiceContext, load_registry
from bergstream.devstack.stack.ports import free_ports

PAYMENT_V1: dict[str, Any] = {
    "type": "record",
    "name": "Payment",
    "namespace": "bergstream.test",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "currency", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
    ],
}
#: Version 2 adds an optional field (an evolution Iceberg expresses).
PAYMENT_V2: dict[str, Any] = copy.deepcopy(PAYMENT_V1)
PAYMENT_V2["fields"].append({"name": "country", "type": ["null", "string"], "default": None})

#: Kafka timestamp of the produced records (one day: one time bucket per partition).
BASE_MS = int(dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.UTC).timestamp() * 1000)
_CURRENCIES = ("EUR", "USD", "CHF")


def payment(i: int, version: int = 1) -> dict[str, Any]:
    """Payment number ``i`` (a version 2 one has a country)."""
    value: dict[str, Any] = {
        "id": i,
        "currency": _CURRENCIES[i % 3],
        "amount": round(i * 1.25 + 0.5, 2),
        "at": dt.datetime.fromtimestamp((BASE_MS + i * 1000) / 1000, dt.UTC),
        "note": None if i % 2 else f"note {i}",
        "tags": [f"t{j}" for j in range(i % 3)],
    }
    if version == 2:
        value["country"] = None if i % 4 == 0 else f"C{i % 5}"
    return value


def produce_avro(
    bootstrap: str,
    registry_url: str,
    topic: str,
    schema: dict[str, Any],
    values: list[tuple[int, dict[str, Any]]],
    first_ms: int = BASE_MS,
) -> int:
    """Produce ``(partition, value)`` pairs serialized by ``AvroSerializer`` (registering the
    schema under ``<topic>-value``); returns the schema id the records carry."""
    from confluent_kafka import Producer
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = SchemaRegistryClient({"url": registry_url})
    serializer = AvroSerializer(client, json.dumps(schema))
    context = SerializationContext(topic, MessageField.VALUE)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    schema_id = -1
    for n, (partition, value) in enumerate(values):
        data = serializer(value, context)
        assert data is not None
        schema_id = int.from_bytes(data[1:5], "big")
        producer.produce(
            topic, value=data, key=b"k%d" % n, partition=partition, timestamp=first_ms + n
        )
    assert producer.flush(30) == 0
    return schema_id


def codecs_settings(
    registry_url: str, match: str, refresh_seconds: float = 0.0, timeout_seconds: float = 5.0
) -> dict[str, Any]:
    """A ``codecs:`` section typing the values of the topics ``match`` names."""
    return {
        "schema_registry": {
            "url": registry_url,
            "subject_refresh_seconds": refresh_seconds,
            "timeout_seconds": timeout_seconds,
        },
        "topics": [{"match": match, "value": "registry"}],
    }


def typed_context(home: Path, codecs: dict[str, Any]) -> ServiceContext:
    """A service context whose config has ``codecs`` (and the installed plugins)."""
    config = BergstreamConfig.model_validate({"codecs": codecs})
    plugins = load_registry()
    if "avro" not in plugins.registrations("value codec"):
        import pytest

        pytest.fail(
            "no value codec 'avro' is installed: the value_codecs entry point is missing "
            "(pip install -e . after pyproject.toml lists it)"
        )
    return ServiceContext(config=config, plugins=plugins, home=home)


def codecs_yaml(codecs: dict[str, Any]) -> str:
    """``codecs`` as a top-level YAML section (JSON is YAML)."""
    return textwrap.dedent(f"\ncodecs: {json.dumps(codecs)}\n")


def closed_registry_url() -> str:
    """A registry URL on a port nothing listens on."""
    (port,) = free_ports(1)
    return f"http://127.0.0.1:{port}/apis/ccompat/v7"
