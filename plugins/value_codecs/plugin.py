"""Registers the ``raw`` and ``avro`` value codecs through the ``bergstream`` entry-point group."""

from __future__ import annotations

from bergstream.core.api import (
    EmptyConfig,
    ServiceContext,
    ValueCodecRegistration,
    hookimpl,
)
from bergstream.plugins.value_codecs.codec import AvroCodec, RawCodec


def create_raw_codec(config: EmptyConfig, context: ServiceContext) -> RawCodec:
    """The ``raw`` codec (no settings)."""
    return RawCodec()


def create_avro_codec(config: EmptyConfig, context: ServiceContext) -> AvroCodec:
    """The ``avro`` codec (no settings)."""
    return AvroCodec()


@hookimpl
def register_value_codecs() -> list[ValueCodecRegistration]:
    """Register the ``raw`` and ``avro`` value codecs."""
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
    ]
