"""The ``json`` value codec: plain JSON objects with no Schema Registry and no framing.

Each top-level key seen in the data becomes a column; :mod:`.shapes` says how a
window of rows is grouped into shapes and how each shape is declared as a JSON Schema. The
declared schemas then play the part registered schemas play for the ``json-schema`` codec
(which decodes and encodes with them): each is a version of the table's layout, folded with
the same evolution rule; its id (a hash of its text) is the row's schema id; the pipeline keeps
them in the table's properties like registered ones, so KSI re-encodes rows without the data
that made them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
from pyiceberg.types import IcebergType

from bergstream.core.api import DecodedValues, RegisteredSchema, Shapes
from bergstream.plugins.value_codecs.json_schema.codec import JsonSchemaCodec
from bergstream.plugins.value_codecs.plain_json.shapes import (
    MAX_SHAPES,
    declare_shapes,
    joined_kinds,
    observe,
    shape_id,
    within_kinds,
)
from bergstream.plugins.value_codecs.shared.schema_cache import Resolve

__all__ = ["PlainJsonCodec"]


class PlainJsonCodec:
    """Plain JSON objects: columns inferred from the data (see the module docstring)."""

    schema_types: tuple[str, ...] = ("JSON",)
    #: Values carry no Confluent framing: rows are grouped by :meth:`shapes`.
    framed = False

    def __init__(self, max_shapes: int = MAX_SHAPES) -> None:
        self.max_shapes = max_shapes
        self._json = JsonSchemaCodec()

    def shapes(
        self,
        values: pa.Array,
        columns: Mapping[str, IcebergType] | None,
        subject: str,
        *,
        window: bool = False,
        telling: bool = False,
    ) -> Shapes:
        """The shapes of ``values`` (``large_binary``, nulls allowed) declared against the
        table's current columns (top-level value fields by name), each as a schema of
        ``subject`` (``window``: see :func:`.shapes.declare_shapes`). At most
        ``max_shapes`` per call, unless ``values`` are ``telling`` values of bounded calls."""
        found = observe(values, None if telling else self.max_shapes)
        texts = declare_shapes(found.shapes, columns, window=window)
        schemas = [
            RegisteredSchema(shape_id(text), "JSON", text, subject=subject, version=None)
            for text in texts
        ]
        by_shape = np.array([s.schema_id for s in schemas] + [-1], np.int64)
        return Shapes(by_shape[found.shape_of], found.errors, schemas)

    def telling_rows(self, values: pa.Array, *, telling: bool = False) -> np.ndarray:
        """The rows of ``values`` that make its shapes: declaring only them declares what the
        whole batch declares (a few rows per shape; a driver folds them instead of the batch).
        Bounded as :meth:`shapes` is."""
        limit = None if telling else self.max_shapes
        return np.asarray(observe(values, limit).telling, dtype=np.int64)

    def joined_kinds(self, values: pa.Array) -> dict[str, Any]:
        """Each top-level key's kind over ``values`` taken together (picklable): what the
        columns folded from ``values`` are made of."""
        return joined_kinds(observe(values, None).shapes)

    def within_kinds(self, values: pa.Array, joined: Mapping[str, Any]) -> bool:
        """Whether every value of ``values`` (a window of records, bounded as :meth:`shapes`
        is) has only keys of ``joined`` (from :meth:`joined_kinds`), each of a kind the joined
        one holds as it is: folding ``values`` with the values ``joined`` came from makes the
        same columns as folding those alone."""
        return within_kinds(observe(values, self.max_shapes).shapes, joined)

    def iceberg_type(self, schema: RegisteredSchema, resolve: Resolve | None) -> IcebergType:
        """The Iceberg type of a declared shape's values."""
        return self._json.iceberg_type(schema, resolve)

    def arrow_type(self, schema: RegisteredSchema) -> pa.DataType:
        """The Arrow type :meth:`decode` gives for a declared shape."""
        return self._json.arrow_type(schema)

    def decode(self, schema: RegisteredSchema, payloads: pa.Array) -> DecodedValues:
        """Decode the payloads of one shape's rows (see ``JsonSchemaCodec.decode``)."""
        return self._json.decode(schema, payloads)

    def encode(self, schema: RegisteredSchema, values: pa.Array) -> pa.Array:
        """The canonical payloads of one shape's values: its keys in its order, compact."""
        return self._json.encode(schema, values)
