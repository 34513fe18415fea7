"""What runs in Spark's Python workers for a typed micro-batch: row-contract rows in (Arrow
batches from ``mapInArrow``), typed rows out, decoded by core's :class:`~bergstream.core.api.
TypedRows`, the same decoder ISK and KSI use, so a record gets the same row wherever it is read.

The columns the decoder does not change (partition, offset, timestamp, headers, and the key when
keys stay raw) pass through as Spark sent them; typed columns are converted to the Arrow types
Spark reads back (:mod:`~bergstream.pipeline.spark_arrow`). Why values did not decode is counted
per cause into a Spark accumulator the driver reports.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from bergstream.core.api import DecodedRows, ShapeCodec, TypedRows, split_framing
from bergstream.pipeline.spark_arrow import to_spark_array
from bergstream.pipeline.typed import ShippedSchemas

__all__ = [
    "TELLING_SCHEMA",
    "CausesParam",
    "DecodeJob",
    "decode_batch",
    "decode_batches",
    "telling_values",
]

Causes = Counter[tuple[str, str]]

#: What :func:`telling_values` yields (a Spark DDL schema): the input column, one of its values.
TELLING_SCHEMA = "column string, value binary"
_TELLING_ARROW = pa.schema([("column", pa.string()), ("value", pa.binary())])


class CausesParam:
    """Spark accumulator parameter of undecodable counts: ``(side, cause) -> rows``."""

    def zero(self, value: Causes) -> Causes:
        """An empty count."""
        return Counter()

    def addInPlace(self, first: Causes, second: Causes) -> Causes:
        """``first`` with ``second`` added."""
        first.update(second)
        return first


@dataclass(frozen=True)
class DecodeJob:
    """Everything a worker needs for one batch (pickled into the ``mapInArrow`` function)."""

    rows: TypedRows
    schemas: ShippedSchemas
    #: the output columns, in the table's order
    names: tuple[str, ...]
    #: output columns taken from the input as they are
    passthrough: frozenset[str]
    #: input columns holding framed values to decode (``kafka_value``, ``kafka_key``)
    framed: tuple[str, ...]
    #: a Spark accumulator with :class:`CausesParam`
    causes: Any


def _array(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(column, pa.ChunkedArray):
        return column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    return column


def decode_batch(job: DecodeJob, batch: pa.RecordBatch, causes: Causes) -> DecodedRows:
    """``batch`` (row-contract columns) decoded by ``job``, its undecodable counts added to
    ``causes``. Raises :class:`~bergstream.pipeline.typed.SchemasNeeded` before decoding a
    batch that holds a schema id the driver did not ship."""
    rows = pa.Table.from_batches([batch])
    for column in job.framed:
        framed, ids = split_framing(rows.column(column))
        job.schemas.check(int(i) for i in np.unique(ids[framed]))
    decoded = job.rows.decode(rows)
    causes.update(decoded.causes)
    return decoded


def decode_batches(job: DecodeJob, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` function (bind ``job`` with ``functools.partial``): typed batches of
    row-contract batches. Raises :class:`~bergstream.pipeline.typed.SchemasNeeded` before
    decoding a batch that holds a schema id the driver did not ship."""
    causes: Causes = Counter()
    try:
        for batch in batches:
            decoded = decode_batch(job, batch, causes)
            arrays = [
                _array(batch.column(name))
                if name in job.passthrough
                else to_spark_array(decoded.table.column(name))
                for name in job.names
            ]
            yield pa.RecordBatch.from_arrays(arrays, names=list(job.names))
    finally:
        if causes:
            job.causes.add(causes)


def telling_values(
    codecs: dict[str, ShapeCodec], batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` function (bind ``codecs``, input column -> its shape codec, with
    ``functools.partial``) that picks out, per batch, the values whose shapes make the batch's:
    the driver folds those few instead of every value (:data:`TELLING_SCHEMA`)."""
    for batch in batches:
        for column, codec in codecs.items():
            values = _array(batch.column(column))
            if not pa.types.is_large_binary(values.type):
                values = values.cast(pa.large_binary())
            rows = codec.telling_rows(values)
            if len(rows):
                picked = values.take(pa.array(rows)).cast(pa.binary())
                names = pa.array([column] * len(rows), pa.string())
                yield pa.RecordBatch.from_arrays([names, picked], schema=_TELLING_ARROW)
