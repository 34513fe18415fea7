"""Raw topics copied together: one streaming query for a group of topics, one Spark job per
micro-batch for all of them, one Iceberg append per table.

Why: one streaming query per topic pays, for every topic and every micro-batch, a query's
planning, a Kafka read job, a write job and their scheduling. ``bench/pipeline_many_topics.py``
(50 topics of 20k records of 1 KB, local[2]): 14,447 records/s with a query per topic, 35,113
with the group reading through Spark's source, in the same run (one topic of 1M: 76,317); with
the workers reading Kafka themselves, 100,073 (one topic: 104,462, in that run).
A group subscribes to all its topics at once; each micro-batch's rows are read from Kafka by
Spark's Python workers (librdkafka; Spark's Kafka source when only Java client settings say how)
and written straight into each topic's table (:mod:`~bergstream.pipeline.group_files`), and the
driver commits each table's files in one append whose snapshot summary carries that table's new
boundary. The topics' Kafka offsets are asked in one request for all, the tables' boundaries and
commits four at a time.

Exactly once per table, as for a single topic (:mod:`~bergstream.pipeline.stream`): each
batch reads every topic's end offsets from Spark's offset log and each table's boundary, keeps
only the rows at or past the boundary and commits them with the boundary moved to the ends. A
batch replayed after a crash skips the tables it committed already. The checkpoint only saves
work: it lives under a digest of the group's topics and tables (a new group starts a new one,
at the tables' boundaries).

Who joins: topics in ``append`` mode without a ``codecs:`` rule, whose table has the row
contract's columns and partitioning on storage the workers can write (:func:`group_target`).
The others run as queries of their own. A table that cannot take its commit leaves the group
(:class:`GroupMembersFailed`): the caller runs that topic alone, with its retries, and starts
the group again without it.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import reduce
from typing import TYPE_CHECKING, Any

from bergstream.core.api import (
    BOUNDARY_PROPERTY,
    ROW_ARROW_SCHEMA,
    ROW_SCHEMA,
    Boundary,
    format_boundary,
    merge_boundaries,
)
from bergstream.pipeline.batch_rows import batch_ranges, planned_picks
from bergstream.pipeline.checkpoint import (
    batch_end_offsets_by_topic,
    group_checkpoint_path,
    topic_lock,
)
from bergstream.pipeline.group_files import (
    GROUP_FILES_SCHEMA,
    write_fetched_group_files,
    write_group_files,
    written_by_topic,
)
from bergstream.pipeline.kafka import admin_client, topics_offsets
from bergstream.pipeline.kafka_fetch import FetchSettings
from bergstream.pipeline.metrics import (
    BATCH_SECONDS,
    COMMIT_SECONDS,
    FAILURES,
    LAST_COMMIT,
    RECORDS,
    WRITTEN_BYTES,
    failure_cause,
)
from bergstream.pipeline.settings import PipelineLake
from bergstream.pipeline.stream import (
    PipelineError,
    RunResult,
    await_query,
    kafka_source,
    keep_condition,
    prefixed_report,
    start_query,
    starting_offsets,
    worker_fetch_settings,
)
from bergstream.pipeline.tables import LakeTable, s3_filesystem_options
from bergstream.pipeline.typed_files import FileTarget, WrittenFile, file_target

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["GroupMembersFailed", "group_target", "run_group"]

Report = Callable[[str], None]


class GroupMembersFailed(RuntimeError):
    """Tables of a group that could not take their commit (topic: error); the batch committed
    every other table."""

    def __init__(self, failures: dict[str, str]) -> None:
        self.failures = failures
        super().__init__(
            "; ".join(f"topic '{topic}': {error}" for topic, error in sorted(failures.items()))
        )


def group_target(table: LakeTable) -> FileTarget | None:
    """How the group's workers write ``table``'s files, or None when its topic must run on a
    query of its own: columns other than the row contract's (typed columns from an earlier
    ``codecs:`` rule), another partitioning, or storage the workers cannot write."""
    current = table.current_schema(refresh=False)
    if current.schema.as_struct() != ROW_SCHEMA.as_struct():
        return None
    return file_target(
        ROW_ARROW_SCHEMA,
        table.partition_spec(),
        table.data_location(),
        current.properties,
        s3_filesystem_options(table.lake),
    )


@dataclass
class _Member:
    topic: str
    table: LakeTable
    target: FileTarget
    result: RunResult


class GroupBatchWriter:
    """The group's ``foreachBatch`` function: every member's new rows written in one job, then
    one append per table."""

    def __init__(
        self,
        members: Sequence[_Member],
        checkpoint: Any,
        report: Report,
        began: float,
        fetch: FetchSettings | None = None,
    ) -> None:
        self.members = {m.topic: m for m in members}
        #: How the workers read the batch's offset ranges themselves (None: Spark's source).
        self.fetch = fetch
        #: The tables of the last batch that refused their commit (topic: error).
        self.failures: dict[str, str] = {}
        self.checkpoint = checkpoint
        self.report = report
        self.began = began

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        began = time.monotonic()
        try:
            self._write(batch, batch_id)
        except GroupMembersFailed:
            raise
        except Exception as error:
            for topic in self.members:
                FAILURES.labels(topic, failure_cause(error)).inc()
            raise
        elapsed = time.monotonic() - began
        for topic in self.members:
            BATCH_SECONDS.labels(topic).observe(elapsed)

    def _write(self, batch: DataFrame, batch_id: int) -> None:
        ends = batch_end_offsets_by_topic(self.checkpoint, batch_id)
        plans: list[tuple[_Member, Boundary, Boundary]] = []
        failures: dict[str, str] = {}

        def boundary(member: _Member) -> Boundary | None:
            try:
                return member.table.boundary()
            except Exception as error:  # a table dropped or unreadable: it leaves the group
                FAILURES.labels(member.topic, failure_cause(error)).inc()
                failures[member.topic] = " ".join(str(error).split())[:600]
                return None

        # Each table's boundary is a catalog round trip: a few at once, as for the commits.
        with ThreadPoolExecutor(max_workers=4, thread_name_prefix="bergstream-boundary") as pool:
            boundaries = list(pool.map(boundary, self.members.values()))
        for member, old in zip(self.members.values(), boundaries, strict=True):
            end = ends.get(member.topic, {})
            if old is not None and any(offset > old.get(p, 0) for p, offset in end.items()):
                plans.append((member, old, end))
        if not plans:
            self._fail(failures)
            return  # a replay of a batch every table has
        targets = {m.topic: m.target for m, _, _ in plans}
        writing = time.monotonic()
        answer = self._written_files(batch, plans, targets)
        written = written_by_topic(answer)
        self.report(
            f"batch {batch_id}: {len(answer)} file(s) of {len(written)} topic(s) written in "
            f"{time.monotonic() - writing:.1f} s"
        )

        def commit(plan: tuple[_Member, Boundary, Boundary]) -> None:
            member, old, end = plan
            files = written.get(member.topic, [])
            if not files:
                return  # only aborted records or transaction markers: no snapshot
            new = merge_boundaries(old, end)
            try:
                with COMMIT_SECONDS.labels(member.topic).time():
                    member.table.append_files(files, {BOUNDARY_PROPERTY: format_boundary(new)})
            except Exception as error:  # this table leaves the group; the others are committed
                FAILURES.labels(member.topic, failure_cause(error)).inc()
                failures[member.topic] = " ".join(str(error).split())[:600]
                return
            LAST_COMMIT.labels(member.topic).set_to_current_time()
            self._account(member, batch_id, files, new)

        # Each table's commit is its own (its own boundary): a few at once, as many round
        # trips to the catalog and the table's storage overlap.
        with ThreadPoolExecutor(max_workers=4, thread_name_prefix="bergstream-commit") as pool:
            list(pool.map(commit, plans))
        self._fail(failures)

    def _written_files(
        self,
        batch: DataFrame,
        plans: list[tuple[_Member, Boundary, Boundary]],
        targets: dict[str, FileTarget],
    ) -> list[Any]:
        """Write the rows of ``plans`` (each member from its table's boundary to the batch's
        end) into their tables' files in one job; the workers' answer rows."""
        from pyspark.sql import functions as F

        spark = batch.sparkSession
        if self.fetch is not None:
            ranges = [
                replace(offsets, topic=member.topic)
                for member, old, end in plans
                for offsets in batch_ranges(old, end)
            ]
            tasks, picks = planned_picks(spark, ranges)
            write = functools.partial(write_fetched_group_files, targets, self.fetch, tasks)
            return picks.mapInArrow(write, GROUP_FILES_SCHEMA).collect()
        wanted = [(F.col("topic") == m.topic) & keep_condition(old) for m, old, _ in plans]
        # One Python task per Kafka partition paid about 0.3 s of its own (100 partitions:
        # 30 s of a 200k-record batch here); a task per core reads them one after the other.
        parallelism = max(spark.sparkContext.defaultParallelism, 1)
        rows = batch.where(reduce(lambda a, b: a | b, wanted)).coalesce(parallelism)
        write_rows = functools.partial(write_group_files, targets)
        return rows.mapInArrow(write_rows, GROUP_FILES_SCHEMA).collect()

    def _fail(self, failures: dict[str, str]) -> None:
        """Raise :class:`GroupMembersFailed` for ``failures``, if any (kept for the runner)."""
        if failures:
            self.failures = failures
            raise GroupMembersFailed(failures)

    def _account(
        self, member: _Member, batch_id: int, files: list[WrittenFile], boundary: Boundary
    ) -> None:
        records = sum(f.records for f in files)
        size = sum(f.size for f in files)
        RECORDS.labels(member.topic).inc(records)
        WRITTEN_BYTES.labels(member.topic).inc(size)
        result = member.result
        result.batches += 1
        result.records += records
        result.bytes_written += size
        result.boundary = dict(boundary)
        elapsed = max(time.monotonic() - self.began, 1e-6)
        self.report(
            f"[{member.topic}] batch {batch_id}: +{records:,} records in {len(files)} file(s), "
            f"{size / 1e6:.2f} MB | total {result.records:,} records, "
            f"{result.records / elapsed:,.0f} records/s"
        )


def run_group(
    spark: SparkSession,
    lake: PipelineLake,
    members: dict[str, LakeTable],
    *,
    once: bool,
    stop: threading.Event,
    report: Report,
    on_started: Callable[[], None] | None = None,
) -> dict[str, RunResult]:
    """Copy the topics of ``members`` (topic: its opened table, :func:`group_target` not None)
    in one streaming query until Kafka has nothing more (``once``) or until ``stop``; each
    topic's result. Raises :class:`GroupMembersFailed` when tables refused their commit (the
    others have theirs), :class:`~bergstream.pipeline.stream.PipelineError` when the query
    failed."""
    began = time.monotonic()
    settings = lake.pipeline
    topics = sorted(members)
    with contextlib.ExitStack() as locks:
        for topic in topics:
            locks.enter_context(topic_lock(lake.checkpoint_dir, lake.namespace, topic))

        # One describe and two offset requests for every topic: per topic, they were round
        # trips to Kafka and through py4j (50 topics: 6.6 s of them, four at a time).
        with admin_client(spark, lake.config, settings.kafka_options) as admin:
            offsets, failures = topics_offsets(
                spark, lake.config, settings.kafka_options, topics, admin
            )
        if failures:  # those topics run alone, whose start reports it (with retries)
            raise GroupMembersFailed(failures)

        def prepare(topic: str) -> tuple[_Member, dict[str, dict[str, int]]]:
            table = members[topic]
            target = group_target(table)
            if target is None:
                raise ValueError(f"topic '{topic}' cannot join a group (see group_target)")
            boundary = table.boundary()
            start = starting_offsets(
                offsets[topic],
                boundary,
                settings.fail_on_data_loss,
                prefixed_report(report, topic),
            )
            result = RunResult(table=f"{lake.namespace}.{topic}", boundary=dict(boundary))
            return _Member(topic, table, target, result), start

        # Each table's metadata and boundary are round trips to the catalog and through py4j:
        # a few at once.
        with ThreadPoolExecutor(max_workers=4, thread_name_prefix="bergstream-group") as pool:
            prepared = list(pool.map(prepare, topics))
        group = [member for member, _ in prepared]
        start: dict[str, dict[str, int]] = {}
        for _, topic_start in prepared:
            start.update(topic_start)
        report(f"the group's {len(topics)} tables and Kafka offsets read")
        checkpoint = group_checkpoint_path(
            lake.checkpoint_dir, lake.namespace, {m.topic: m.table.uuid for m in group}
        )
        report(
            f"copying {len(topics)} topic(s) in one query into {lake.catalog_name}."
            f"{lake.namespace}: {', '.join(topics)}"
        )
        fetch = worker_fetch_settings(lake, topics[0])
        writer = GroupBatchWriter(group, checkpoint, report, began, fetch)
        query = start_query(
            kafka_source(spark, lake, topics, start, with_topic=True),
            f"bergstream-{lake.namespace}-group-{checkpoint.name[:8]}",
            checkpoint,
            writer,
            once,
            settings.trigger_interval_seconds,
        )
        if on_started is not None:
            on_started()
        try:
            try:
                # The writer counted the failures of its batches, member by member.
                await_query(query, once, stop, topics, count_failure=False)
            except PipelineError:
                # Spark wraps what foreachBatch raised; the writer kept which tables refused.
                if writer.failures:
                    raise GroupMembersFailed(writer.failures) from None
                raise
        except GroupMembersFailed:
            # The group starts again without those topics, under another checkpoint: this one
            # is never resumed (the tables' boundaries are the truth).
            shutil.rmtree(checkpoint, ignore_errors=True)
            raise
    for member in group:
        member.result.seconds = time.monotonic() - began
        member.result.boundary = member.table.boundary()
    return {m.topic: m.result for m in group}
