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

from bergstream.core.api import (
    DecodedRows,
    RegisteredSchema,
    ShapeCodec,
    ShapesToFold,
    TypedRows,
    split_framing,
)
from bergstream.pipeline.spark_arrow import to_spark_array
from bergstream.pipeline.typed import SchemasNeeded, ShippedSchemas

__all__ = [
    "TELLING_SCHEMA",
    "CausesParam",
    "DecodeJob",
    "ShapesParam",
    "Tally",
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


class ShapesParam:
    """Spark accumulator parameter of the shapes workers adopted: ``schema id -> schema``."""

    def zero(self, value: dict[int, RegisteredSchema]) -> dict[int, RegisteredSchema]:
        """No shapes."""
        return {}

    def addInPlace(
        self, first: dict[int, RegisteredSchema], second: dict[int, RegisteredSchema]
    ) -> dict[int, RegisteredSchema]:
        """``first`` with ``second``'s shapes added."""
        first.update(second)
        return first


@dataclass
class Tally:
    """What one task's batches add up to: undecodable counts, adopted shapes."""

    causes: Causes
    adopted: dict[int, RegisteredSchema]

    @classmethod
    def empty(cls) -> Tally:
        """Nothing counted yet."""
        return cls(Counter(), {})

    def send(self, job: DecodeJob) -> None:
        """Add this tally to ``job``'s accumulators (once, when the task succeeded)."""
        if self.causes:
            job.causes.add(self.causes)
        if self.adopted and job.shapes is not None:
            job.shapes.add(self.adopted)


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
    #: a Spark accumulator with :class:`ShapesParam` (when ``rows`` adopts shapes)
    shapes: Any = None


def _array(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(column, pa.ChunkedArray):
        return column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    return column


def decode_batch(job: DecodeJob, batch: pa.RecordBatch, tally: Tally) -> DecodedRows:
    """``batch`` (row-contract columns) decoded by ``job``, its undecodable counts and adopted
    shapes added to ``tally``. Raises :class:`~bergstream.pipeline.typed.SchemasNeeded` before
    decoding a batch that holds a schema id the driver did not ship, or shapes that need
    columns the table lacks."""
    rows = pa.Table.from_batches([batch])
    for column in job.framed:
        framed, ids = split_framing(rows.column(column))
        job.schemas.check(int(i) for i in np.unique(ids[framed]))
    try:
        decoded = job.rows.decode(rows)
    except ShapesToFold:
        raise SchemasNeeded(fold_shapes=True) from None
    tally.causes.update(decoded.causes)
    tally.adopted.update(decoded.adopted)
    return decoded


def decode_batches(job: DecodeJob, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` function (bind ``job`` with ``functools.partial``): typed batches of
    row-contract batches. Raises :class:`~bergstream.pipeline.typed.SchemasNeeded` before
    decoding a batch that holds a schema id the driver did not ship."""
    tally = Tally.empty()
    try:
        for batch in batches:
            decoded = decode_batch(job, batch, tally)
            arrays = [
                _array(batch.column(name))
                if name in job.passthrough
                else to_spark_array(decoded.table.column(name))
                for name in job.names
            ]
            yield pa.RecordBatch.from_arrays(arrays, names=list(job.names))
    finally:
        tally.send(job)


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
