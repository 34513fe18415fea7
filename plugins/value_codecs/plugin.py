"""Registers the ``raw``, ``avro``, ``json-schema``, ``protobuf``, ``json`` and
``connect-json`` value codecs through the ``bergstream`` entry-point group. Each factory
imports its codec (numba kernels, pyarrow) on first use, so listing plugins stays cheap."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bergstream.core.api import EmptyConfig, ValueCodecRegistration, hookimpl

if TYPE_CHECKING:
    from bergstream.core.api import ServiceContext
    from bergstream.plugins.value_codecs.avro.codec import AvroCodec
    from bergstream.plugins.value_codecs.connect_json.codec import ConnectJsonCodec
    from bergstream.plugins.value_codecs.json_schema.codec import JsonSchemaCodec
    from bergstream.plugins.value_codecs.plain_json.codec import PlainJsonCodec
    from bergstream.plugins.value_codecs.protobuf.codec import ProtobufCodec
    from bergstream.plugins.value_codecs.raw import RawCodec


def create_raw_codec(config: EmptyConfig, context: ServiceContext) -> RawCodec:
    """The ``raw`` codec (no settings)."""
    from bergstream.plugins.value_codecs.raw import RawCodec

    return RawCodec()


def create_avro_codec(config: EmptyConfig, context: ServiceContext) -> AvroCodec:
    """The ``avro`` codec (no settings)."""
    from bergstream.plugins.value_codecs.avro.codec import AvroCodec

    return AvroCodec()


def create_json_schema_codec(config: EmptyConfig, context: ServiceContext) -> JsonSchemaCodec:
    """The ``json-schema`` codec (no settings)."""
    from bergstream.plugins.value_codecs.json_schema.codec import JsonSchemaCodec

    return JsonSchemaCodec()


def create_protobuf_codec(config: EmptyConfig, context: ServiceContext) -> ProtobufCodec:
    """The ``protobuf`` codec (no settings)."""
    from bergstream.plugins.value_codecs.protobuf.codec import ProtobufCodec

    return ProtobufCodec()


def create_plain_json_codec(config: EmptyConfig, context: ServiceContext) -> PlainJsonCodec:
    """The ``json`` codec (no settings)."""
    from bergstream.plugins.value_codecs.plain_json.codec import PlainJsonCodec

    return PlainJsonCodec()


def create_connect_json_codec(config: EmptyConfig, context: ServiceContext) -> ConnectJsonCodec:
    """The ``connect-json`` codec (no settings)."""
    from bergstream.plugins.value_codecs.connect_json.codec import ConnectJsonCodec

    return ConnectJsonCodec()


@hookimpl
def register_value_codecs() -> list[ValueCodecRegistration]:
    """Register the ``raw``, ``avro``, ``json-schema``, ``protobuf``, ``json`` and
    ``connect-json`` value codecs."""
    return [
        ValueCodecRegistration(
            name="raw",
            factory=create_raw_codec,
            config_model=EmptyConfig,
            description="values kept as bytes in kafka_value (the default)",
        ),
        ValueCodecRegistration(
            name="avro",
            factory=create_avro_codec,
            config_model=EmptyConfig,
            description="Avro values of a Schema Registry (Confluent framing) as typed columns, "
            "decoded and re-encoded byte for byte by compiled loops",
        ),
        ValueCodecRegistration(
            name="json-schema",
            factory=create_json_schema_codec,
            config_model=EmptyConfig,
            description="JSON values of a Schema Registry JSON Schema (Confluent framing) as "
            "typed columns; values not in the canonical compact form keep their bytes",
        ),
        ValueCodecRegistration(
            name="protobuf",
            factory=create_protobuf_codec,
            config_model=EmptyConfig,
            description="Protobuf values of a Schema Registry schema (.proto text or a "
            "serialized descriptor; Confluent framing with message indexes) as typed columns",
        ),
        ValueCodecRegistration(
            name="json",
            factory=create_plain_json_codec,
            config_model=EmptyConfig,
            needs_registry=False,
            description="plain JSON objects, no registry: a column per top-level key, types "
            "inferred per batch; values not in the compact form of their shape keep their bytes",
        ),
        ValueCodecRegistration(
            name="connect-json",
            factory=create_connect_json_codec,
            config_model=EmptyConfig,
            needs_registry=False,
            description="Kafka Connect JsonConverter envelopes (schemas.enable=true, e.g. "
            "Debezium), no registry: the payload's fields as columns typed by the embedded "
            "Connect schema (logical and Debezium types included); values keep their bytes",
        ),
    ]
