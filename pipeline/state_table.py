"""The state table of an ``upsert`` or ``debezium`` topic, kept in step with its log table.

After each micro-batch's append to the log table (which moves the log's boundary), the pipeline
applies the log rows the state table has not seen (``[state boundary, log boundary)`` of each
partition, read from the log table) with :func:`~bergstream.core.api.reduce_changes`: the last
change per key. One Iceberg commit on the state table then

- adds one Parquet data file with the new rows (the last change of each key),
- adds one *position delete* file naming the rows those keys had (or every row, after a
  truncate): where they are comes from the :class:`~bergstream.core.api.StateIndex` this module
  keeps of the table's live rows,
- and carries the log boundary it reached in its snapshot summary, as the log table's commits
  do.

So the state table is exactly once by the same rule as the log table: a restarted pipeline
applies the log rows from the state table's own boundary, and a replayed range writes nothing
twice. Records that cannot be applied go to the topic's table in ``lake.rejected_namespace``
first (with a boundary of its own, so a replay adds none twice), with their reason.

Row-level deletes are *position* deletes (the reasons are in :mod:`bergstream.core.state_index`);
``bergstream pipeline maintain`` rewrites data files that have deletes and drops the delete
files no data file needs (:mod:`.maintain`). A commit that raced with maintenance (a data file it
deletes from was rewritten) is made again from a fresh index.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bergstream.core.api import (
    BOUNDARY_PROPERTY,
    ROW_SCHEMA,
    Boundary,
    FileRowsCache,
    StateFileRows,
    StateIndex,
    StateLayout,
    StateLayoutError,
    TableMode,
    TableModeRule,
    arrow_type,
    format_boundary,
    load_catalog,
    log_rows_between,
    merge_boundaries,
    position_deletes_table,
    read_state_snapshot,
    reduce_changes,
    rejected_layout,
    state_identities,
    state_layout,
    table_boundary,
)
from bergstream.pipeline.settings import PipelineLake
from bergstream.pipeline.tables import (
    LakeTable,
    create_table,
    load_table,
    s3_filesystem_options,
)
from bergstream.pipeline.typed_files import TableStorage

if TYPE_CHECKING:
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table
    from pyspark.sql import SparkSession

__all__ = ["MODE_PROPERTY", "STATE_TABLE_PROPERTIES", "StateKeeper", "StateStep"]

Report = Callable[[str], None]

#: Table property saying which mode made a state table.
MODE_PROPERTY = "bergstream.table-mode"

#: Properties of a new state table: format 2 (position deletes), deletes merged on read.
STATE_TABLE_PROPERTIES: dict[str, str] = {
    "format-version": "2",
    "write.parquet.compression-codec": "zstd",
    "write.delete.mode": "merge-on-read",
    "write.update.mode": "merge-on-read",
    "write.merge.mode": "merge-on-read",
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "20",
}

#: Commits of one step tried again after a conflict with maintenance.
_COMMIT_ATTEMPTS = 4


@dataclass
class StateStep:
    """What one :meth:`StateKeeper.catch_up` did."""

    rows_read: int = 0
    upserts: int = 0
    deleted_rows: int = 0
    rejected: int = 0
    truncated: bool = False
    boundary: Boundary = field(default_factory=dict)
    seconds: float = 0.0


class StateKeeper:
    """Keeps one topic's state table (and its rejected rows) in step with its log table."""

    def __init__(
        self,
        spark: SparkSession,
        lake: PipelineLake,
        topic: str,
        rule: TableModeRule,
        report: Report = print,
    ) -> None:
        if rule.mode is TableMode.APPEND:
            raise ValueError(f"topic {topic!r} is an append topic: it has no state table")
        self.spark = spark
        self.lake = lake
        self.topic = topic
        self.rule = rule
        self.report = report
        self.catalog = load_catalog(lake)
        self.cache = FileRowsCache()
        #: The live rows of the state table as of ``index_snapshot`` (None: read it again).
        self.index: StateIndex | None = None
        self.index_snapshot: int | None = None
        self.storage: TableStorage | None = None

    # ------------------------------------------------------------------ tables

    def _log(self) -> Table:
        return self.catalog.load_table(self.lake.table_identifier(self.topic))

    def _state_table(self, layout: StateLayout) -> LakeTable:
        """The state table, created (and its schema brought to ``layout``'s) as needed."""
        namespace = self.lake.current_namespace
        base = ROW_SCHEMA if layout.mode is TableMode.UPSERT else _contract_base()
        properties = {**STATE_TABLE_PROPERTIES, MODE_PROPERTY: layout.mode.value}
        create_table(self.spark, self.lake, namespace, self.topic, base, None, None, properties)
        table = load_table(self.spark, self.lake, namespace, self.topic)
        assert table is not None
        found = table.current_schema().properties.get(MODE_PROPERTY)
        if found is not None and found != layout.mode.value:
            raise StateLayoutError(
                f"{namespace}.{self.topic} is the state table of mode {found!r}, but tables: "
                f"makes the topic {layout.mode.value!r}; drop that table to build it anew"
            )
        table.commit_schema(
            layout.schema, layout.last_column_id, {MODE_PROPERTY: layout.mode.value}
        )
        return table

    def _rejected_table(self, schema: Schema, last_column_id: int) -> LakeTable:
        namespace = self.lake.rejected_namespace
        properties = {k: v for k, v in STATE_TABLE_PROPERTIES.items() if "mode" not in k}
        create_table(
            self.spark, self.lake, namespace, self.topic, ROW_SCHEMA, None, None, properties
        )
        table = load_table(self.spark, self.lake, namespace, self.topic)
        assert table is not None
        table.commit_schema(schema, max(last_column_id, schema.highest_field_id), {})
        return table

    def _storage(self, table: LakeTable) -> TableStorage:
        if self.storage is None:
            self.storage = TableStorage(table.data_location(), s3_filesystem_options(self.lake))
        return self.storage

    # ------------------------------------------------------------------ one step

    def catch_up(self) -> StateStep | None:
        """Apply the log rows the state table lacks; None when it has them all (or the log's
        layout cannot make a state: reported, and the log goes on being copied)."""
        began = time.monotonic()
        log = self._log()
        end = table_boundary(log)
        if not end:
            return None
        try:
            layout = state_layout(log.schema(), log.metadata.last_column_id, self.rule)
            state = self._state_table(layout)
        except StateLayoutError as error:
            self.report(f"warning: {self.lake.current_namespace}.{self.topic} not kept: {error}")
            return None
        for attempt in range(_COMMIT_ATTEMPTS):
            start = state.boundary()
            if all(offset <= start.get(p, 0) for p, offset in end.items()):
                return None
            try:
                step = self._step(log, layout, state, start, end)
            except _Conflict as conflict:
                self.index = None
                if attempt == _COMMIT_ATTEMPTS - 1:
                    raise RuntimeError(
                        f"{state.qualified}: {_COMMIT_ATTEMPTS} commits lost to concurrent "
                        f"commits (maintenance?): {conflict}"
                    ) from None
                continue
            step.seconds = time.monotonic() - began
            return step
        return None

    def _current_index(
        self, state: LakeTable, layout: StateLayout
    ) -> tuple[StateIndex, int | None]:
        state.refresh()
        current = state.java.currentSnapshot()
        snapshot_id = None if current is None else int(current.snapshotId())
        if self.index is None or snapshot_id != self.index_snapshot:
            table = self.catalog.load_table((self.lake.current_namespace, self.topic))
            snapshot = read_state_snapshot(
                table,
                lambda rows: state_identities(layout, rows),
                layout.identity,
                self.cache,
                snapshot_id,
            )
            self.index, self.index_snapshot = snapshot.index, snapshot_id
        assert self.index is not None
        return self.index, snapshot_id

    def _step(
        self,
        log: Table,
        layout: StateLayout,
        state: LakeTable,
        start: Boundary,
        end: Boundary,
    ) -> StateStep:
        rows = log_rows_between(log, start, end)
        index, base_snapshot = self._current_index(state, layout)
        rejected_schema = rejected_layout(log.schema())
        changes = reduce_changes(layout, rows, arrow_type(rejected_schema), index)
        removed = changes.removed
        boundary = merge_boundaries(start, end)
        if changes.rejected.num_rows:
            self._reject(changes.rejected, rejected_schema, log.metadata.last_column_id, end)
        storage = self._storage(state)
        written: list[str] = []
        try:
            data = self._write(storage, state, "state", changes.upserts, layout.arrow_schema)
            if data is not None:
                written.append(data[0])
            deletes = None
            if removed:
                deletes = self._write(storage, state, "deletes", position_deletes_table(removed))
                if deletes is not None:
                    written.append(deletes[0])
            new_snapshot = self._commit(state, data, deletes, removed, base_snapshot, boundary)
        except BaseException:
            for path in written:
                storage.delete(path)
            raise
        added = None
        if data is not None:
            partitions = changes.upserts.column("kafka_partition").to_numpy(zero_copy_only=False)
            added = StateFileRows(data[0], changes.upsert_ids, np.asarray(partitions, np.int32))
        self.index = index.with_changes(removed, added)
        self.index_snapshot = new_snapshot
        return StateStep(
            rows_read=rows.num_rows,
            upserts=changes.upserts.num_rows,
            deleted_rows=int(sum(len(p) for p in removed.values())),
            rejected=changes.rejected.num_rows,
            truncated=changes.truncated,
            boundary=boundary,
        )

    def _write(
        self,
        storage: TableStorage,
        table: LakeTable,
        kind: str,
        rows: pa.Table,
        schema: pa.Schema | None = None,
    ) -> tuple[str, int, int] | None:
        """Write ``rows`` as one Parquet file in ``table``'s data location: (path, size,
        rows), or None for no rows."""
        if not rows.num_rows:
            return None
        path = f"{table.data_location()}/{kind}-{uuid.uuid4().hex}.parquet"
        if schema is not None:
            rows = rows.cast(schema)
        with storage.open(path) as sink:
            pq.write_table(rows, sink, compression="zstd", store_schema=False)
            size = int(sink.tell())
        return path, size, rows.num_rows

    def _commit(
        self,
        state: LakeTable,
        data: tuple[str, int, int] | None,
        deletes: tuple[str, int, int] | None,
        removed: Mapping[str, np.ndarray],
        base_snapshot: int | None,
        boundary: Boundary,
    ) -> int:
        """One commit of the new data and delete files with ``boundary``; the new snapshot's
        id. Raises :class:`_Conflict` if a concurrent commit (maintenance) changed the files
        the deletes name."""
        jvm = self.spark.sparkContext._jvm  # type: ignore[attr-defined]
        iceberg = jvm.org.apache.iceberg
        table = state.java
        spec = table.spec()
        if deletes is None:
            operation = table.newAppend()
        else:
            operation = table.newRowDelta()
            if base_snapshot is not None:
                operation = operation.validateFromSnapshot(base_snapshot)
            paths = jvm.java.util.ArrayList()
            for path in removed:
                paths.add(path)
            operation = operation.validateDataFilesExist(paths).validateDeletedFiles()
        if data is not None:
            file = _data_file(iceberg, table, data[0], data[1])
            operation = operation.appendFile(file) if deletes is None else operation.addRows(file)
        if deletes is not None:
            path, size, count = deletes
            metrics = iceberg.parquet.ParquetUtil.fileMetrics(
                table.io().newInputFile(path, size), iceberg.MetricsConfig.forPositionDelete(table)
            )
            delete = (
                iceberg.FileMetadata.deleteFileBuilder(spec)
                .ofPositionDeletes()
                .withPath(path)
                .withFormat(iceberg.FileFormat.PARQUET)
                .withFileSizeInBytes(size)
                .withRecordCount(count)
                .withMetrics(metrics)
                .build()
            )
            operation = operation.addDeletes(delete)
        operation.set(BOUNDARY_PROPERTY, format_boundary(boundary))
        try:
            operation.commit()
        except Exception as error:
            name = _java_class(error)
            if "ValidationException" in name or "CommitFailedException" in name:
                raise _Conflict(str(error)) from None
            raise
        state.refresh()
        return int(table.currentSnapshot().snapshotId())

    def _reject(self, rows: pa.Table, schema: Schema, last_column_id: int, end: Boundary) -> None:
        """Append rejected rows to the topic's rejected table (those below its own boundary are
        there already: a range applied again after a crash adds none twice)."""
        table = self._rejected_table(schema, last_column_id)
        known = table.boundary()
        if known:
            partitions = rows.column("kafka_partition").to_numpy(zero_copy_only=False)
            offsets = rows.column("kafka_offset").to_numpy(zero_copy_only=False)
            floor = np.array([known.get(int(p), 0) for p in partitions], dtype=np.int64)
            rows = rows.filter(pa.array(offsets >= floor))
        if not rows.num_rows:
            return
        storage = TableStorage(table.data_location(), s3_filesystem_options(self.lake))
        written = self._write(storage, table, "rejected", rows, arrow_type(schema))
        assert written is not None
        jvm = self.spark.sparkContext._jvm  # type: ignore[attr-defined]
        iceberg = jvm.org.apache.iceberg
        java = table.java
        append = java.newAppend().appendFile(_data_file(iceberg, java, written[0], written[1]))
        append.set(BOUNDARY_PROPERTY, format_boundary(merge_boundaries(known, end)))
        append.commit()


def _data_file(iceberg: Any, table: Any, path: str, size: int) -> Any:
    """The Java ``DataFile`` of a Parquet file of an unpartitioned ``table``, its metrics read
    from the file's footer by Iceberg's own code, as its writers make them."""
    metrics = iceberg.parquet.ParquetUtil.fileMetrics(
        table.io().newInputFile(path, size), iceberg.MetricsConfig.forTable(table)
    )
    return (
        iceberg.DataFiles.builder(table.spec())
        .withPath(path)
        .withFormat(iceberg.FileFormat.PARQUET)
        .withFileSizeInBytes(size)
        .withMetrics(metrics)
        .build()
    )


class _Conflict(RuntimeError):
    """A state commit lost to a concurrent commit that changed the files it names."""


def _java_class(error: Exception) -> str:
    java = getattr(error, "java_exception", None)
    return "" if java is None else str(java.getClass().getName())


def _contract_base() -> Schema:
    """The row contract's first five columns: a debezium state table's schema starts so (fresh
    ids 1 to 5, as Iceberg assigns them), then takes its own with ``commit_schema``."""
    from pyiceberg.schema import Schema

    return Schema(*ROW_SCHEMA.fields[:5], schema_id=0)
