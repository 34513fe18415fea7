"""The ``connect-json`` value codec: Kafka Connect's ``JsonConverter`` with
``schemas.enable=true`` (Debezium topics, most often), no Schema Registry and no framing.

Each value is an envelope ``{"schema": <Connect schema>, "payload": <value>}``
(:mod:`.connect_json_envelopes`). The codec is a shape codec whose shapes are the distinct
Connect schemas of a batch: each is declared as a schema of type ``CONNECT`` (its canonical
text, its id a hash of it), which then plays the part a registered schema plays: a version of
the table's layout, folded with the same evolution rule, the row's ``kafka_value_schema_id``,
and kept in the table's properties. The columns are the payload's: a ``struct`` schema's
fields are the top-level columns, any other schema one column ``value`` (``key`` for keys),
typed as :mod:`.connect_json_types` says; :mod:`.connect_json_values` reads the payloads.

**Bytes are always kept.** The envelope repeats its schema in every value and ``JsonConverter``
writes numbers, base64 and defaults its own way, so the typed columns never give the original
text back byte for byte: every row that decodes has ``keep_bytes`` true, ``kafka_value`` holds
the original envelope, and KSI serves those bytes. :meth:`ConnectJsonCodec.encode` is never
called on such rows (core re-encodes only rows whose bytes were not kept) and refuses to run.

A payload of ``null`` (``{"schema": ..., "payload": null}``) is a null value: every column
null, no error, like a tombstone's. A value that is not an envelope, or whose payload does not
fit its schema, fails its row with the cause.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
from pyiceberg.types import IcebergType

from bergstream.core.api import DecodedValues, RegisteredSchema, Shapes
from bergstream.plugins.value_codecs.connect_json_envelopes import (
    EnvelopeError,
    Envelopes,
    row_bytes,
)
from bergstream.plugins.value_codecs.connect_json_types import parse_connect_schema
from bergstream.plugins.value_codecs.connect_json_values import Mismatch, PayloadReader, Reparse
from bergstream.plugins.value_codecs.schema_cache import Resolve, SchemaCache

__all__ = ["MAX_SCHEMAS", "SCHEMA_TYPE", "ConnectJsonCodec"]

#: The schema type of the declared schemas.
SCHEMA_TYPE = "CONNECT"
#: Distinct Connect schemas one batch of records may have (a pipeline worker's Arrow batch, a
#: range ISK reads); rows of further ones keep their bytes with the cause. Telling values
#: gathered from such batches are not bounded again.
MAX_SCHEMAS = 1024


def _parse(schema: RegisteredSchema, resolve: Resolve | None) -> Any:
    """The Connect schema of a declared schema (its canonical text)."""
    return parse_connect_schema(orjson.loads(schema.schema))


class ConnectJsonCodec:
    """Kafka Connect JSON envelopes (see the module docstring)."""

    schema_types: tuple[str, ...] = (SCHEMA_TYPE,)
    #: Values carry no Confluent framing: rows are grouped by :meth:`shapes`.
    framed = False

    def __init__(self, max_schemas: int = MAX_SCHEMAS) -> None:
        self.max_schemas = max_schemas
        self._envelopes = Envelopes()
        self._readers: SchemaCache[Any, PayloadReader] = SchemaCache(
            SCHEMA_TYPE, "a Kafka Connect schema", _parse, PayloadReader
        )

    # -- shapes

    def shapes(
        self,
        values: pa.Array,
        columns: Mapping[str, IcebergType] | None,
        subject: str,
        *,
        window: bool = False,
        telling: bool = False,
    ) -> Shapes:
        """The Connect schemas of ``values`` (``large_binary``, nulls allowed), each declared
        as a schema of ``subject``. The schemas say the types themselves, so ``columns`` and
        ``window`` change nothing. At most ``max_schemas`` per call, unless ``values`` are
        ``telling`` values of bounded calls."""
        found = self._envelopes.observe(values, None if telling else self.max_schemas)
        schemas = [
            RegisteredSchema(d.schema_id, SCHEMA_TYPE, d.text, subject=subject, version=None)
            for d in found.schemas
        ]
        by_index = np.array([s.schema_id for s in schemas] + [-1], np.int64)
        return Shapes(by_index[found.schema_of], found.errors, schemas)

    def telling_rows(self, values: pa.Array, *, telling: bool = False) -> np.ndarray:
        """The first row of each distinct Connect schema of ``values``: declaring only them
        declares what the whole batch declares. Bounded as :meth:`shapes` is."""
        limit = None if telling else self.max_schemas
        return np.asarray(self._envelopes.observe(values, limit).telling, dtype=np.int64)

    def joined_kinds(self, values: pa.Array) -> dict[str, Any]:
        """The schema ids of ``values`` (picklable): the columns folded from ``values`` are
        made of those schemas alone."""
        found = self._envelopes.observe(values, None)
        return {str(d.schema_id): True for d in found.schemas}

    def within_kinds(self, values: pa.Array, joined: Mapping[str, Any]) -> bool:
        """Whether every envelope of ``values`` (bounded as :meth:`shapes` is) has a schema
        among ``joined`` (from :meth:`joined_kinds`): folding ``values`` in then adds no
        version."""
        found = self._envelopes.observe(values, self.max_schemas)
        return all(str(d.schema_id) in joined for d in found.schemas)

    # -- types

    def iceberg_type(self, schema: RegisteredSchema, resolve: Resolve | None) -> IcebergType:
        """The Iceberg type of a declared schema's payloads (placeholder field ids); raises
        ``SchemaNotExpressible`` for one Iceberg cannot hold."""
        return self._readers.get(schema, resolve).type

    def arrow_type(self, schema: RegisteredSchema) -> pa.DataType:
        """The Arrow type :meth:`decode` gives for a declared schema."""
        return self._readers.get(schema, None).arrow

    # -- rows

    def decode(self, schema: RegisteredSchema, payloads: pa.Array) -> DecodedValues:
        """Decode envelopes (``large_binary``, no nulls) of one declared schema; a value that
        is not such an envelope, or whose payload does not fit, gives a null row and its
        cause, never an exception. Every row keeps its bytes (see the module docstring)."""
        reader = self._readers.get(schema, None)
        envelopes = self._envelopes
        expected = schema.schema_id
        out: list[Any] = []
        errors: list[str | None] = []
        for row in row_bytes(payloads):
            value: Any = None
            error: str | None = None
            if row is None:
                error = "value: null (a tombstone has no envelope)"
            else:
                try:
                    payload = envelopes.payload_of(row, expected)
                    if payload is not None:
                        try:
                            value = reader.read(payload)
                        except Reparse:
                            payload = envelopes.payload_of(row, expected, exact=True)
                            value = reader.read(payload)
                except EnvelopeError as cause:
                    error = str(cause)
                except Mismatch as cause:
                    error = cause.describe()
                except RecursionError:
                    error = "corrupt payload: nested too deeply"
            out.append(value)
            errors.append(error)
        values = reader.build(out, errors)
        return DecodedValues(values=values, keep_bytes=np.ones(len(out), bool), errors=errors)

    def encode(self, schema: RegisteredSchema, values: pa.Array) -> pa.Array:
        """Refuses: every row of this codec keeps its original bytes, so core never asks for
        its payloads (see the module docstring)."""
        raise NotImplementedError(
            "connect-json values are never re-encoded: every row keeps its original envelope "
            f"in kafka_value (asked to encode {len(values)} row(s) of schema id "
            f"{schema.schema_id})"
        )
