"""The ``raw`` value codec (:class:`~bergstream.core.api.ValueCodec`): values stay bytes."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from pyiceberg.types import IcebergType

from bergstream.core.api import DecodedValues, RegisteredSchema, SchemaNotExpressible
from bergstream.plugins.value_codecs.shared.arena_columns import payload_buffers
from bergstream.plugins.value_codecs.shared.schema_cache import Resolve

__all__ = ["RawCodec"]


class RawCodec:
    """Values kept as bytes (the default). It reads no registry schema type, so the table
    layout never asks it for columns: :meth:`iceberg_type` raises
    :class:`SchemaNotExpressible`. :meth:`decode` and :meth:`encode` are the identity on
    bytes (every payload "decodes" to itself, canonically)."""

    schema_types: tuple[str, ...] = ()

    def iceberg_type(self, schema: RegisteredSchema, resolve: Resolve) -> IcebergType:
        """Always raises: raw values have no typed columns."""
        raise SchemaNotExpressible("the raw codec keeps values as bytes in kafka_value")

    def decode(self, schema: RegisteredSchema, payloads: pa.Array) -> DecodedValues:
        """The payloads themselves, none kept aside, none failed."""
        data, offsets = payload_buffers(payloads)
        rows = len(offsets) - 1
        values = pa.Array.from_buffers(
            pa.large_binary(), rows, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
        )
        return DecodedValues(
            values=values, keep_bytes=np.zeros(rows, dtype=bool), errors=[None] * rows
        )

    def encode(self, schema: RegisteredSchema, values: pa.Array) -> pa.Array:
        """The values themselves, as ``large_binary``."""
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        return values.cast(pa.large_binary())
