"""The ``connect-json`` value codec: Kafka Connect's ``JsonConverter`` with
``schemas.enable=true`` (Debezium topics, most often), no Schema Registry and no framing.

Each value is an envelope ``{"schema": <Connect schema>, "payload": <value>}``
(:mod:`.envelopes`). The codec is a shape codec whose shapes are the distinct
Connect schemas of a batch: each is declared as a schema of type ``CONNECT`` (its canonical
text, its id a hash of it), which then plays the part a registered schema plays: a version of
the table's layout, folded with the same evolution rule, the row's ``kafka_value_schema_id``,
and kept in the table's properties. The columns are the payload's: a ``struct`` schema's
fields are the top-level columns, any other schema one column ``value`` (``key`` for keys),
typed as :mod:`.types` says; :mod:`.values` reads the payloads.

**Bytes are always kept.** The envelope repeats its schema in every value and ``JsonConverter``
writes numbers, base64 and defaults its own way, so the typed columns never give the original
text back byte for byte: every row that decodes has ``keep_bytes`` true, ``kafka_value`` holds
the original envelope, and KSI serves those bytes. :meth:`ConnectJsonCodec.encode` is never
called on such rows (core re-encodes only rows whose bytes were not kept) and refuses to run.

A payload of ``null`` (``{"schema": ..., "payload": null}``) is a null value: every column
null, no error, like a tombstone's. An envelope whose payload does not fit its schema fails its
row with the cause.

**JSON without envelopes too.** A value that is JSON but no envelope, as ``JsonConverter``
writes with ``schemas.enable=false``, is read by the plain JSON codec's rules (``json``: its
shapes declared as JSON Schemas, schema type ``JSON``, and re-encoded canonically), so one rule
reads a Debezium topic whichever way its Connect worker's converter is set, and a topic whose
converter changed keeps every record.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
from pyiceberg.types import IcebergType

from bergstream.core.api import DecodedValues, RegisteredSchema, Shapes
from bergstream.plugins.value_codecs.connect_json.envelopes import (
    EnvelopeError,
    Envelopes,
    row_bytes,
)
from bergstream.plugins.value_codecs.connect_json.types import parse_connect_schema
from bergstream.plugins.value_codecs.connect_json.values import Mismatch, PayloadReader, Reparse
from bergstream.plugins.value_codecs.plain_json.codec import PlainJsonCodec
from bergstream.plugins.value_codecs.shared.schema_cache import Resolve, SchemaCache

__all__ = ["MAX_SCHEMAS", "PLAIN_TYPE", "SCHEMA_TYPE", "ConnectJsonCodec"]

#: The schema type of the declared schemas.
SCHEMA_TYPE = "CONNECT"
#: The schema type of the plain JSON shapes of values without envelopes.
PLAIN_TYPE = "JSON"
#: Distinct Connect schemas one batch of records may have (a pipeline worker's Arrow batch, a
#: range ISK reads); rows of further ones keep their bytes with the cause. Telling values
#: gathered from such batches are not bounded again.
MAX_SCHEMAS = 1024


def _parse(schema: RegisteredSchema, resolve: Resolve | None) -> Any:
    """The Connect schema of a declared schema (its canonical text)."""
    return parse_connect_schema(orjson.loads(schema.schema))


class ConnectJsonCodec:
    """Kafka Connect JSON envelopes (see the module docstring)."""

    schema_types: tuple[str, ...] = (SCHEMA_TYPE, PLAIN_TYPE)
    #: Values carry no Confluent framing: rows are grouped by :meth:`shapes`.
    framed = False

    def __init__(self, max_schemas: int = MAX_SCHEMAS) -> None:
        self.max_schemas = max_schemas
        self._plain = PlainJsonCodec()
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
        ids = by_index[found.schema_of]
        errors = list(found.errors)
        if found.plain:  # JSON without envelopes: the plain JSON codec's shapes
            rows = np.asarray(found.plain, dtype=np.int64)
            plain = self._plain.shapes(
                values.take(pa.array(rows)), columns, subject, window=window, telling=telling
            )
            ids[rows] = plain.ids
            for row, error in zip(rows, plain.errors, strict=True):
                errors[row] = error
            schemas += plain.schemas
        return Shapes(ids, errors, schemas)

    def _plain_rows(self, values: pa.Array, limit: int | None) -> tuple[Any, np.ndarray]:
        found = self._envelopes.observe(values, limit)
        return found, np.asarray(found.plain, dtype=np.int64)

    def telling_rows(self, values: pa.Array, *, telling: bool = False) -> np.ndarray:
        """The first row of each distinct Connect schema of ``values``, and the plain JSON
        codec's telling rows of its values without envelopes: declaring only them declares
        what the whole batch declares. Bounded as :meth:`shapes` is."""
        found, rows = self._plain_rows(values, None if telling else self.max_schemas)
        told = np.asarray(found.telling, dtype=np.int64)
        if len(rows):
            plain = self._plain.telling_rows(values.take(pa.array(rows)), telling=telling)
            told = np.sort(np.concatenate([told, rows[plain]]))
        return told

    def joined_kinds(self, values: pa.Array) -> dict[str, Any]:
        """The schema ids of ``values``' envelopes, and the plain JSON codec's kinds of its
        values without envelopes (under ``"json"``; picklable): what the columns folded from
        ``values`` are made of."""
        found, rows = self._plain_rows(values, None)
        joined: dict[str, Any] = {str(d.schema_id): True for d in found.schemas}
        kinds = self._plain.joined_kinds(values.take(pa.array(rows))) if len(rows) else {}
        if kinds:
            joined[PLAIN_TYPE] = kinds
        return joined

    def within_kinds(self, values: pa.Array, joined: Mapping[str, Any]) -> bool:
        """Whether every envelope of ``values`` (bounded as :meth:`shapes` is) has a schema
        among ``joined`` (from :meth:`joined_kinds`), and its values without envelopes are
        within the plain kinds there: folding ``values`` in then adds no version."""
        found, rows = self._plain_rows(values, self.max_schemas)
        if not all(str(d.schema_id) in joined for d in found.schemas):
            return False
        if not len(rows):
            return True
        plain = values.take(pa.array(rows))
        return self._plain.within_kinds(plain, joined.get(PLAIN_TYPE, {}))

    # -- types

    def iceberg_type(self, schema: RegisteredSchema, resolve: Resolve | None) -> IcebergType:
        """The Iceberg type of a declared schema's payloads (placeholder field ids); raises
        ``SchemaNotExpressible`` for one Iceberg cannot hold."""
        if schema.schema_type == PLAIN_TYPE:
            return self._plain.iceberg_type(schema, resolve)
        return self._readers.get(schema, resolve).type

    def arrow_type(self, schema: RegisteredSchema) -> pa.DataType:
        """The Arrow type :meth:`decode` gives for a declared schema."""
        if schema.schema_type == PLAIN_TYPE:
            return self._plain.arrow_type(schema)
        return self._readers.get(schema, None).arrow

    # -- rows

    def decode(self, schema: RegisteredSchema, payloads: pa.Array) -> DecodedValues:
        """Decode envelopes (``large_binary``, no nulls) of one declared schema; a value that
        is not such an envelope, or whose payload does not fit, gives a null row and its
        cause, never an exception. Every row keeps its bytes (see the module docstring); values
        of a plain JSON shape are decoded as the ``json`` codec decodes them."""
        if schema.schema_type == PLAIN_TYPE:
            return self._plain.decode(schema, payloads)
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
        """The canonical text of a plain JSON shape's values (as ``json``); refuses for an
        envelope's: those rows keep their original bytes, so core never asks for their
        payloads (see the module docstring)."""
        if schema.schema_type == PLAIN_TYPE:
            return self._plain.encode(schema, values)
        raise NotImplementedError(
            "connect-json values are never re-encoded: every row keeps its original envelope "
            f"in kafka_value (asked to encode {len(values)} row(s) of schema id "
            f"{schema.schema_id})"
        )
