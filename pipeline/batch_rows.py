"""A micro-batch's rows as the typed steps read them: Spark's DataFrame from its Kafka source,
or, when the workers can read Kafka themselves (:mod:`~bergstream.pipeline.kafka_fetch`), the
batch's offset ranges read by the same ``mapInArrow`` function that decodes them."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from bergstream.pipeline.kafka_fetch import (
    FetchSettings,
    OffsetRange,
    fetched_batches,
    plan_tasks,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = ["BatchRows", "batch_ranges", "planned_picks"]

#: librdkafka's offset meaning "the partition's log start".
LOG_START = -2

ArrowFunction = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]


def batch_ranges(boundary: dict[int, int], end: dict[int, int]) -> list[OffsetRange]:
    """What a micro-batch ending at ``end`` adds to a table at ``boundary``: per partition,
    from the boundary (the log start for a partition the table has nothing of) to the end."""
    return [
        OffsetRange(partition, boundary.get(partition, LOG_START), until)
        for partition, until in sorted(end.items())
        if until > boundary.get(partition, 0)
    ]


def planned_picks(
    spark: SparkSession, ranges: Iterable[OffsetRange]
) -> tuple[tuple[tuple[OffsetRange, ...], ...], DataFrame]:
    """``ranges`` dealt into one task per core (:func:`~.kafka_fetch.plan_tasks`), and the
    frame of ``spark.range`` ids, one per Spark partition, that picks each task's ranges for a
    ``mapInArrow`` function."""
    tasks = plan_tasks(list(ranges), spark.sparkContext.defaultParallelism)
    return tasks, spark.range(0, len(tasks), 1, max(1, len(tasks)))


def _read_then(
    settings: FetchSettings,
    tasks: tuple[tuple[OffsetRange, ...], ...],
    function: ArrowFunction,
    picks: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    return function(fetched_batches(settings, tasks, picks))


@dataclass(frozen=True)
class BatchRows:
    """One micro-batch's rows (row-contract columns)."""

    #: the rows from Spark's Kafka source (samples, raw appends)
    frame: DataFrame
    #: how workers read ``ranges`` themselves; None: ``map_in_arrow`` reads ``frame``
    fetch: FetchSettings | None = None
    ranges: tuple[OffsetRange, ...] = ()

    def map_in_arrow(
        self, function: ArrowFunction, schema: str | StructType, columns: tuple[str, ...] = ()
    ) -> DataFrame:
        """``mapInArrow(function, schema)`` over the batch's rows (only ``columns`` of them
        when given), read by the workers themselves when they can."""
        if self.fetch is None:
            frame = self.frame.select(*columns) if columns else self.frame
            return frame.mapInArrow(function, schema)
        if columns:
            function = functools.partial(_selecting, columns, function)
        tasks, picks = planned_picks(self.frame.sparkSession, self.ranges)
        return picks.mapInArrow(functools.partial(_read_then, self.fetch, tasks, function), schema)


def _selecting(
    columns: tuple[str, ...], function: ArrowFunction, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    return function(batch.select(list(columns)) for batch in batches)
