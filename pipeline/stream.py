"""Kafka to Iceberg, exactly once: Spark Structured Streaming with a ``foreachBatch`` writer.

Exactly once does not rest on Spark's checkpoint. Each micro-batch:

1. reads its end offsets from Spark's offset log and the table's boundary (next offset per
   partition, from the newest snapshot summary that has one);
2. drops every row below the boundary (a batch replayed after a crash writes nothing twice);
3. appends the rest in one Iceberg commit whose snapshot summary carries the new boundary, the
   union of the old one and the batch's end offsets, so it covers every partition seen so far.

A batch with nothing new commits nothing. On start the Kafka source begins at the boundary (each
partition it does not cover at its log start), so a run with its checkpoint deleted resumes where
the table ends.

A topic the ``codecs:`` section types gets typed columns: each batch's rows are
decoded on their way to the same append (:mod:`~bergstream.pipeline.typed_batch`).
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import reduce
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bergstream.core.api import (
    BOUNDARY_PROPERTY,
    ROW_SCHEMA,
    Boundary,
    TableMode,
    TableModeRule,
    format_boundary,
    librdkafka_speaks,
    merge_boundaries,
    report_undecodable,
)
from bergstream.pipeline.batch_rows import BatchRows, batch_ranges
from bergstream.pipeline.checkpoint import batch_end_offsets, checkpoint_path, topic_lock
from bergstream.pipeline.kafka import (
    TopicOffsets,
    refused_message,
    source_client_properties,
    topic_offsets,
)
from bergstream.pipeline.kafka_fetch import FetchSettings
from bergstream.pipeline.metrics import (
    BATCH_SECONDS,
    COMMIT_SECONDS,
    FAILURES,
    LAST_COMMIT,
    RECORDS,
    WRITTEN_BYTES,
    failure_cause,
    record_source_progress,
)
from bergstream.pipeline.session import (
    PipelineSetupError,
    lake_system_properties,
    set_system_properties,
)
from bergstream.pipeline.settings import PipelineLake, cluster_warnings
from bergstream.pipeline.state_table import StateKeeper
from bergstream.pipeline.tables import LakeTable, open_table
from bergstream.pipeline.typed import TopicTyping
from bergstream.pipeline.typed_batch import TypedBatches

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = [
    "PipelineError",
    "RunResult",
    "await_query",
    "kafka_rows",
    "kafka_source",
    "keep_condition",
    "prefixed_report",
    "run_pipeline",
    "start_query",
    "starting_offsets",
    "stop_between_batches",
]

Report = Callable[[str], None]

HEADERS_TYPE = "array<struct<key:string,value:binary>>"
_EARLIEST = -2


class PipelineError(RuntimeError):
    """The streaming query failed; the message carries Spark's reason."""


@dataclass
class RunResult:
    """What one ``run_pipeline`` call did."""

    table: str
    batches: int = 0
    records: int = 0
    bytes_written: int = 0
    seconds: float = 0.0
    boundary: Boundary = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """The JSON summary ``bergstream pipeline run`` prints: table, batches, records,
        bytes_written, seconds (rounded to ms) and the boundary by partition (text keys)."""
        return {
            "table": self.table,
            "batches": self.batches,
            "records": self.records,
            "bytes_written": self.bytes_written,
            "seconds": round(self.seconds, 3),
            "boundary": {str(p): o for p, o in sorted(self.boundary.items())},
        }


def starting_offsets(
    offsets: TopicOffsets, boundary: Boundary, fail_on_data_loss: bool, report: Report
) -> dict[str, dict[str, int]]:
    """Spark's ``startingOffsets``: the boundary where it covers a partition, else the log
    start (-2, earliest). A boundary below the log start means Kafka deleted records the table
    never got: an error, or with ``fail_on_data_loss`` off a warning and the log start."""
    start: dict[str, int] = {}
    for partition in offsets.partitions:
        log_start = offsets.log_start[partition]
        if partition not in boundary:
            start[str(partition)] = _EARLIEST
            continue
        next_offset = boundary[partition]
        if next_offset < log_start:
            lost = f"offsets {next_offset}..{log_start - 1} of partition {partition}"
            if fail_on_data_loss:
                raise PipelineSetupError(
                    f"Kafka deleted {lost} of topic '{offsets.topic}' (retention) before the "
                    "pipeline copied them; set lake.pipeline.fail_on_data_loss: false to go on "
                    "from the log start"
                )
            report(f"warning: Kafka deleted {lost} before they were copied; skipping them")
            start[str(partition)] = _EARLIEST
        else:
            start[str(partition)] = next_offset
    return {offsets.topic: start}


def keep_condition(boundary: Boundary) -> Column:
    """Spark's condition keeping the rows at or past ``boundary`` (every row of a partition
    it does not cover)."""
    from pyspark.sql import functions as F

    partition, offset = F.col("kafka_partition"), F.col("kafka_offset")
    known = [(partition == p) & (offset >= b) for p, b in sorted(boundary.items())]
    new = ~partition.isin(sorted(boundary))
    return reduce(lambda a, b: a | b, known, new)


def kafka_source(
    spark: SparkSession,
    lake: PipelineLake,
    topics: Sequence[str],
    start: dict[str, dict[str, int]],
    with_topic: bool = False,
) -> DataFrame:
    """The pipeline's streaming Kafka source of ``topics`` from ``start`` (read_committed,
    headers, the lake's client settings), as the row contract's columns (and ``topic`` first,
    ``with_topic``)."""
    settings = lake.pipeline
    reader = spark.readStream.format("kafka")
    for key, value in source_client_properties(lake.config, settings.kafka_options).items():
        reader = reader.option(f"kafka.{key}", value)
    reader = (
        reader.option("subscribe", ",".join(topics))
        .option("startingOffsets", json.dumps(start))
        .option("kafka.isolation.level", "read_committed")
        .option("includeHeaders", "true")
        .option("failOnDataLoss", str(settings.fail_on_data_loss).lower())
    )
    if settings.max_offsets_per_trigger is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(settings.max_offsets_per_trigger))
    return kafka_rows(reader.load(), with_topic)


def kafka_rows(frame: DataFrame, with_topic: bool = False) -> DataFrame:
    """The row contract's columns of a Spark Kafka source frame (``includeHeaders``), a record
    without headers given an empty list; ``with_topic``: its ``topic`` column first."""
    from pyspark.sql import functions as F

    return frame.select(
        *([F.col("topic")] if with_topic else []),
        F.col("partition").alias("kafka_partition"),
        F.col("offset").alias("kafka_offset"),
        F.col("timestamp").alias("kafka_timestamp"),
        F.col("timestampType").alias("kafka_timestamp_type"),
        F.col("key").alias("kafka_key"),
        F.coalesce(F.col("headers"), F.array().cast(HEADERS_TYPE)).alias("kafka_headers"),
        F.col("value").alias("kafka_value"),
    )


def worker_fetch_settings(lake: PipelineLake, topic: str) -> FetchSettings | None:
    """How typed batches' workers read ``topic`` themselves: ``lake.kafka_client`` in
    librdkafka's names and ``lake.kafka_bootstrap``. None while the pipeline has
    ``kafka_options`` (Java client names librdkafka would not take as they are): those batches
    are read through Spark's source, as are they when librdkafka lacks the SASL mechanism
    (confluent-kafka's wheels have no GSSAPI)."""
    settings = lake.pipeline
    if settings.kafka_options:
        return None
    mechanism = lake.config.kafka_client.sasl_mechanism
    if mechanism is not None and not librdkafka_speaks(mechanism):
        return None
    client = {
        **lake.config.kafka_client.librdkafka(),
        "bootstrap.servers": lake.config.kafka_bootstrap,
    }
    return FetchSettings(client, topic, settings.fail_on_data_loss)


def _offsets_text(boundary: Boundary, limit: int = 8) -> str:
    items = [f"{p}:{o}" for p, o in sorted(boundary.items())]
    if len(items) > limit:
        items = [*items[:limit], f"... ({len(items)} partitions)"]
    return " ".join(items) or "-"


class BatchWriter:
    """The ``foreachBatch`` function: one idempotent Iceberg append per micro-batch (its rows
    decoded by ``typed`` on the way for a typed topic)."""

    def __init__(
        self,
        table: LakeTable,
        checkpoint: Path,
        result: RunResult,
        report: Report,
        typed: TypedBatches | None = None,
        fetch: FetchSettings | None = None,
        state: StateKeeper | None = None,
    ):
        self.table = table
        self.state = state
        self.checkpoint = checkpoint
        self.result = result
        self.report = report
        self.typed = typed
        self.fetch = fetch
        self.started = time.monotonic()

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        topic = self.table.topic
        began = time.monotonic()
        try:
            self._write(batch, batch_id)
        except Exception as error:
            FAILURES.labels(topic, failure_cause(error)).inc()
            raise
        BATCH_SECONDS.labels(topic).observe(time.monotonic() - began)

    def _write(self, batch: DataFrame, batch_id: int) -> None:
        end = batch_end_offsets(self.checkpoint, batch_id, self.table.topic)
        old = self.table.boundary()
        if all(offset <= old.get(partition, 0) for partition, offset in end.items()):
            self.catch_up_state()  # a replay of a batch the log table already has
            return
        rows = batch.where(keep_condition(old))
        if rows.isEmpty():
            return  # only aborted records or transaction markers: no snapshot
        new = merge_boundaries(old, end)
        text = format_boundary(new)
        undecodable = 0
        if self.typed is None:
            self._append(self._with_table_columns(rows), text)
        else:
            batch_rows = BatchRows(rows, self.fetch, tuple(batch_ranges(old, end)))
            causes = self.typed.write(
                batch_rows, lambda frame: self._append(frame, text), {BOUNDARY_PROPERTY: text}
            )
            report_undecodable("pipeline", self.table.topic, causes)
            undecodable = sum(causes.values())
        self._account(batch_id, text, new, undecodable)
        self.catch_up_state()

    def catch_up_state(self) -> None:
        """Apply what the log table has and the topic's state table lacks (upsert and
        debezium topics)."""
        if self.state is None:
            return
        step = self.state.catch_up()
        if step is None:
            return
        self.report(
            f"state {self.state.lake.current_namespace}.{self.table.topic}: "
            f"{step.rows_read:,} change(s) -> {step.upserts:,} row(s) written, "
            f"{step.deleted_rows:,} replaced or deleted"
            + (", truncated" if step.truncated else "")
            + (f", {step.rejected:,} rejected" if step.rejected else "")
            + f" in {step.seconds:.2f} s | offsets {_offsets_text(step.boundary)}"
        )

    def _with_table_columns(self, rows: DataFrame) -> DataFrame:
        """Raw rows for a table that has typed columns (its topic is no longer typed by the
        ``codecs:`` section): those columns null, the bytes in ``kafka_value``."""
        from pyspark.sql import functions as F

        if len(self.table.current_schema(refresh=False).schema.fields) == len(rows.columns):
            return rows
        target = self.table.spark.table(self.table.name).schema
        return rows.select(
            *(
                F.col(f.name)
                if f.name in rows.columns
                else F.lit(None).cast(f.dataType).alias(f.name)
                for f in target.fields
            )
        )

    def _append(self, rows: DataFrame, text: str) -> None:
        with COMMIT_SECONDS.labels(self.table.topic).time():
            self._write_to_table(rows, text)
        LAST_COMMIT.labels(self.table.topic).set_to_current_time()

    def _write_to_table(self, rows: DataFrame, text: str) -> None:
        (
            rows.writeTo(self.table.name)
            .option(f"snapshot-property.{BOUNDARY_PROPERTY}", text)
            # Each Spark task reads one Kafka partition in offset order, so rows arrive
            # clustered by partition and sorted by offset already: no shuffle, no sort; a
            # fanout writer takes the day partitions as they come.
            .option("use-table-distribution-and-ordering", "false")
            .option("fanout-enabled", "true")
            .append()
        )

    def _account(self, batch_id: int, text: str, boundary: Boundary, undecodable: int) -> None:
        self.table.refresh()
        summary: dict[str, str] = {}
        for _, _, candidate in self.table.summaries():
            if candidate.get(BOUNDARY_PROPERTY) == text:
                summary = candidate
                break
        records = int(summary.get("added-records", 0))
        size = int(summary.get("added-files-size", 0))
        files = int(summary.get("added-data-files", 0))
        RECORDS.labels(self.table.topic).inc(records)
        WRITTEN_BYTES.labels(self.table.topic).inc(size)
        result = self.result
        result.batches += 1
        result.records += records
        result.bytes_written += size
        result.boundary = boundary
        elapsed = max(time.monotonic() - self.started, 1e-6)
        self.report(
            f"batch {batch_id}: +{records:,} records in {files} file(s), {size / 1e6:.2f} MB | "
            f"total {result.records:,} records, {result.records / elapsed:,.0f} records/s, "
            f"{result.bytes_written / 1e6 / elapsed:.1f} MB/s written | "
            f"offsets {_offsets_text(boundary)}"
            + (f" | {undecodable:,} value(s) kept as bytes" if undecodable else "")
        )


def stop_between_batches(query: Any, patience_seconds: float = 120) -> None:
    """Stop the query once no batch is running (stopping interrupts a running batch: safe, the
    commit is atomic, but the batch's work is lost), waiting at most ``patience_seconds``."""
    deadline = time.monotonic() + patience_seconds
    while query.isActive and query.status.get("isTriggerActive") and time.monotonic() < deadline:
        time.sleep(0.1)
    if query.isActive:
        query.stop()


def start_query(
    frame: DataFrame,
    name: str,
    checkpoint: Path,
    writer: Callable[[DataFrame, int], None],
    once: bool,
    trigger_seconds: float,
) -> Any:
    """Start ``frame``'s streaming query ``name`` with ``writer`` as its ``foreachBatch``:
    until Kafka has nothing more (``once``), else a micro-batch every ``trigger_seconds``."""
    stream = (
        frame.writeStream.queryName(name)
        .option("checkpointLocation", str(checkpoint))
        .foreachBatch(writer)
    )
    if once:
        stream = stream.trigger(availableNow=True)
    else:
        stream = stream.trigger(processingTime=f"{trigger_seconds} seconds")
    return stream.start()


def await_query(
    query: Any,
    once: bool,
    stop: threading.Event,
    topics: Sequence[str],
    count_failure: bool = True,
) -> None:
    """Wait for the query (to its end with ``once``, else until ``stop``), noting its source's
    progress for the lag metric of ``topics`` every second; a failed query raises
    :class:`PipelineError` (counted for each topic with ``count_failure``)."""
    from pyspark.errors import StreamingQueryException

    try:
        while query.isActive and (once or not stop.is_set()):
            query.awaitTermination(1)
            progress = query.lastProgress
            for topic in topics:
                record_source_progress(topic, progress)
        if not once:
            stop_between_batches(query)
        query.awaitTermination()  # raises what ended a failed query
    except StreamingQueryException as error:
        if count_failure:
            for topic in topics:
                FAILURES.labels(topic, failure_cause(error)).inc()
        raise PipelineError(f"the streaming query failed: {error}") from None


def prefixed_report(report: Report, topic: str) -> Report:
    """``report`` with each line starting ``[topic]`` (several topics share one log)."""

    def tell(line: str) -> None:
        report(f"[{topic}] {line}")

    return tell


def run_pipeline(
    spark: SparkSession,
    lake: PipelineLake,
    topic: str,
    *,
    once: bool,
    report: Report = print,
    stop: threading.Event | None = None,
    codecs: TopicTyping | None = None,
    registry_wait_seconds: float = 60.0,
    mode: TableModeRule | None = None,
    on_started: Callable[[], None] | None = None,
) -> RunResult:
    """Copy ``topic`` into its table until Kafka has nothing more (``once``) or until ``stop``
    is set (continuous, one micro-batch per ``lake.pipeline.trigger_interval_seconds``).

    With ``codecs`` (:func:`~bergstream.pipeline.typed.topic_typing`) the table gets the
    topic's typed columns; a batch whose Schema Registry does not answer waits for it, as long
    as a continuous run lasts, at most ``registry_wait_seconds`` in a ``once`` run (which then
    fails, retriable). With an ``upsert`` or ``debezium`` ``mode`` (the topic's rule of the
    ``tables:`` section) the topic's state table follows the log table
    (:mod:`~bergstream.pipeline.state_table`). ``on_started`` is called once the streaming
    query runs (``pipeline run --metrics-port`` turns ``/readyz`` ready then)."""
    began = time.monotonic()
    stop = stop or threading.Event()
    if codecs is not None:
        _require_pandas()
    for warning in cluster_warnings(lake, spark.sparkContext.master):
        report(warning)
    # A session started before this lake's settings were known (the JVM flags its Kafka login
    # needs are set at start by `pipeline run`).
    set_system_properties(
        spark, {**lake.config.kafka_client.java_system_properties(), **lake_system_properties(lake)}
    )
    table = open_table(spark, lake, topic, create=True)
    settings = lake.pipeline
    with topic_lock(lake.checkpoint_dir, lake.namespace, topic):
        boundary = table.boundary()
        offsets = topic_offsets(spark, lake.config, settings.kafka_options, topic)
        start = starting_offsets(offsets, boundary, settings.fail_on_data_loss, report)
        checkpoint = checkpoint_path(lake.checkpoint_dir, lake.namespace, topic, table.uuid)
        result = RunResult(table=f"{lake.namespace}.{topic}", boundary=dict(boundary))
        report(
            f"copying topic '{topic}' into {lake.catalog_name}.{lake.namespace}.{topic}: "
            f"table at {_offsets_text(boundary)}, Kafka log start "
            f"{_offsets_text(offsets.log_start)}, end {_offsets_text(offsets.end)}"
        )
        if codecs is None and len(table.current_schema(refresh=False).schema.fields) > len(
            ROW_SCHEMA.fields
        ):
            report(
                f"warning: {lake.namespace}.{topic} has typed columns but no codecs: rule types "
                "the topic: its records are written as bytes (kafka_value), typed columns null"
            )
        typed = None
        if codecs is not None:
            typed = TypedBatches(
                table,
                codecs,
                report,
                once=once,
                stop=stop,
                registry_wait_seconds=registry_wait_seconds,
            )
        state = None
        if mode is not None and mode.mode is not TableMode.APPEND:
            state = StateKeeper(spark, lake, topic, mode, report)
        writer = BatchWriter(
            table, checkpoint, result, report, typed, worker_fetch_settings(lake, topic), state
        )
        writer.catch_up_state()  # what a run stopped before the state's commit left
        query = start_query(
            kafka_source(spark, lake, [topic], start),
            f"bergstream-{lake.namespace}-{topic}",
            checkpoint,
            writer,
            once,
            settings.trigger_interval_seconds,
        )
        if on_started is not None:
            on_started()
        try:
            await_query(query, once, stop, [topic])
        except PipelineError as error:
            # Kafka may refuse reads it allowed the admin client (READ but no DESCRIBE ACL).
            refused = refused_message(error, topic, lake.config, settings.kafka_options)
            if refused is None:
                raise
            raise PipelineError(refused) from None
    result.seconds = time.monotonic() - began
    result.boundary = table.boundary()
    return result


def _require_pandas() -> None:
    """Spark's ``mapInArrow`` (the typed decoding step) needs pandas on the driver."""
    try:
        import pandas  # noqa: F401
    except ImportError:
        raise PipelineSetupError(
            "typed tables (a codecs: rule for this topic) need pandas, which Spark's mapInArrow "
            "requires: pip install pandas"
        ) from None


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT (the continuous run then stops after its batch)."""
    stop = threading.Event()

    def handler(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop
