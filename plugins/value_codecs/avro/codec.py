"""The ``avro`` value codec (:class:`~bergstream.core.api.ValueCodec`).

:class:`AvroCodec` maps a registered Avro schema to its Iceberg type and decodes or encodes
whole batches with a program compiled once per schema. Its parsed schemas (references already
resolved) survive pickling, its compiled programs do not: a Spark worker recompiles them on first
use, in well under a millisecond (the numba kernels themselves are compiled once per machine
and cached on disk).

Decoding or encoding a schema that has references needs its references resolved first, by an
:meth:`AvroCodec.iceberg_type` call on this codec or on the one it was pickled from (the table
layout makes that call for every schema it accepts).
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
from pyiceberg.types import IcebergType

from bergstream.core.api import (
    DecodedValues,
    RegisteredSchema,
    arrow_type,
)
from bergstream.plugins.value_codecs.avro.decoder import AvroDecoder
from bergstream.plugins.value_codecs.avro.encoder import AvroEncoder
from bergstream.plugins.value_codecs.avro.program import compile_program
from bergstream.plugins.value_codecs.avro.schema import AvroNode, parse_avro
from bergstream.plugins.value_codecs.avro.types import iceberg_type
from bergstream.plugins.value_codecs.shared.schema_cache import Resolve, SchemaCache

__all__ = ["AvroCodec"]


@dataclass(frozen=True)
class _Compiled:
    type: IcebergType
    decoder: AvroDecoder
    encoder: AvroEncoder


def _build(node: AvroNode) -> _Compiled:
    """The compiled form of a parsed Avro schema."""
    type_ = iceberg_type(node)
    program = compile_program(node)
    arrow = arrow_type(type_)
    return _Compiled(type_, AvroDecoder(program, arrow), AvroEncoder(program, arrow))


class AvroCodec:
    """Avro values written with a registered schema (Confluent framing stripped)."""

    schema_types: tuple[str, ...] = ("AVRO",)

    def __init__(self) -> None:
        self._schemas: SchemaCache[AvroNode, _Compiled] = SchemaCache(
            "AVRO", "Avro", parse_avro, _build
        )

    def iceberg_type(self, schema: RegisteredSchema, resolve: Resolve) -> IcebergType:
        """The Iceberg type of values written with ``schema`` (placeholder field ids); raises
        :class:`SchemaNotExpressible`."""
        return self._schemas.get(schema, resolve).type

    def arrow_type(self, schema: RegisteredSchema) -> pa.DataType:
        """The Arrow type :meth:`decode` gives for ``schema``."""
        return self._schemas.get(schema, None).decoder.arrow_type

    def decode(self, schema: RegisteredSchema, payloads: pa.Array) -> DecodedValues:
        """Decode ``payloads`` (``large_binary``, no nulls); a bad payload gives a null row,
        ``keep_bytes`` and its cause, never an exception."""
        return self._schemas.get(schema, None).decoder.decode(payloads)

    def decode_framed(
        self, schema: RegisteredSchema, values: pa.Array, header: int
    ) -> DecodedValues:
        """:meth:`decode` of the payloads of ``values`` (``large_binary``, no nulls), each one
        after a ``header`` of that many bytes which every value has (the Confluent framing a
        caller checked): no copy of the payloads without their headers is made."""
        return self._schemas.get(schema, None).decoder.decode(values, skip=header)

    def encode(self, schema: RegisteredSchema, values: pa.Array) -> pa.Array:
        """The canonical payloads of ``values`` (the type :meth:`decode` gives; no null rows
        unless the schema is a union with null)."""
        return self._schemas.get(schema, None).encoder.encode(values)
