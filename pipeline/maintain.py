"""``bergstream pipeline maintain``: compaction, snapshot expiry and orphan removal with Iceberg's
Spark procedures, never losing the boundary; for an upsert or debezium topic, of its state table
too, whose row-level deletes compaction folds into rewritten data files.

Safe while the pipeline runs: compaction commits optimistically (a concurrent append only makes
Iceberg retry it), expiry always keeps the snapshot that holds the current boundary (compaction
commits carry none), and orphan removal only deletes files older than
``lake.maintenance.orphan_min_age_hours``, so files of a commit in flight survive.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from bergstream.core.api import Boundary
from bergstream.pipeline.settings import PipelineLake
from bergstream.pipeline.tables import LakeTable, load_table, open_table

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["MaintenanceError", "maintain_table"]

Report = Callable[[str], None]


class MaintenanceError(RuntimeError):
    """Maintenance would have broken a table invariant; the table is left as Iceberg has it."""


def _sql_timestamp(moment: dt.datetime) -> str:
    return "TIMESTAMP '" + moment.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f") + "'"


def _sql_string(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _row(spark: SparkSession, sql: str) -> dict[str, Any]:
    rows = spark.sql(sql).collect()
    return rows[0].asDict() if rows else {}


def _check_boundary(before: Boundary, after: Boundary) -> None:
    lost = {p: o for p, o in before.items() if after.get(p, -1) < o}
    if lost:
        raise MaintenanceError(
            f"the boundary went back from {before} to {after} (partitions {sorted(lost)}): "
            "stop and inspect the table's snapshots before running the pipeline again"
        )


def _expire_before(table: LakeTable, retention_hours: float, now: dt.datetime) -> dt.datetime:
    cutoff = now - dt.timedelta(hours=retention_hours)
    holder = table.boundary_snapshot()
    if holder.timestamp_ms is not None:
        kept = dt.datetime.fromtimestamp(holder.timestamp_ms / 1000, tz=dt.UTC)
        cutoff = min(cutoff, kept)  # snapshots strictly older than the cutoff go
    return cutoff


def _remove_orphans(spark: SparkSession, table: LakeTable, older_than: dt.datetime) -> list[str]:
    """Iceberg's DeleteOrphanFiles action (the procedure refuses ages under 24 hours; the
    configured minimum age is the guard here). S3 warehouses are listed by prefix."""
    jvm = spark.sparkContext._jvm  # type: ignore[attr-defined]
    actions = jvm.org.apache.iceberg.spark.actions.SparkActions.get(
        spark._jsparkSession  # type: ignore[attr-defined]
    )
    action = actions.deleteOrphanFiles(table.java).olderThan(int(older_than.timestamp() * 1000))
    if (table.lake.warehouse or "").startswith("s3://"):
        action = action.usePrefixListing(True)
    return [str(location) for location in action.execute().orphanFileLocations()]


def maintain_table(
    spark: SparkSession,
    lake: PipelineLake,
    topic: str,
    *,
    report: Report = print,
    orphan_min_age_hours: float | None = None,
) -> dict[str, Any]:
    """Compact small files, expire old snapshots and remove orphan files of the topic's table
    and, for an upsert or debezium topic, of its state table (whose data files with row-level
    deletes are rewritten without them, and whose delete files no data file needs any more are
    dropped) and its rejected table; return what each step did. ``orphan_min_age_hours``
    overrides the configured minimum age."""
    table = open_table(spark, lake, topic, create=False)
    result = _maintain(spark, lake, table, report, orphan_min_age_hours)
    state = load_table(spark, lake, lake.current_namespace, topic)
    if state is not None:
        before = _delete_stats(state)
        report(f"state table {state.qualified}:")
        result["state"] = _maintain(spark, lake, state, report, orphan_min_age_hours, deletes=True)
        result["state"]["deletes_before"] = before
        result["state"]["deletes_after"] = _delete_stats(state)
    rejected = load_table(spark, lake, lake.rejected_namespace, topic)
    if rejected is not None:
        report(f"rejected table {rejected.qualified}:")
        result["rejected"] = _maintain(spark, lake, rejected, report, orphan_min_age_hours)
    return result


def _delete_stats(table: LakeTable) -> dict[str, int]:
    """Rows, data files, delete files and deleted positions of ``table``'s current snapshot."""
    table.refresh()
    snapshot = table.java.currentSnapshot()
    summary = {} if snapshot is None else dict(snapshot.summary())
    names = {
        "rows": "total-records",
        "data_files": "total-data-files",
        "delete_files": "total-delete-files",
        "position_deletes": "total-position-deletes",
    }
    return {name: int(summary.get(key, 0)) for name, key in names.items()}


def _maintain(
    spark: SparkSession,
    lake: PipelineLake,
    table: LakeTable,
    report: Report,
    orphan_min_age_hours: float | None,
    deletes: bool = False,
) -> dict[str, Any]:
    """Compaction, expiry and orphan removal of one table. ``deletes``: also rewrite every
    data file that has deletes (``delete-file-threshold`` 1) and drop delete files no data file
    needs, then rewrite the remaining position delete files into fewer."""
    settings = lake.maintenance
    name = _sql_string(table.name)
    system = f"{lake.catalog_name}.system"
    before = table.boundary()
    result: dict[str, Any] = {"table": table.qualified, "boundary_before": before}

    extra = ", 'delete-file-threshold', '1', 'remove-dangling-deletes', 'true'" if deletes else ""
    options = (
        f"map('target-file-size-bytes', '{settings.target_file_size_bytes}', "
        f"'min-input-files', '{settings.min_input_files}', "
        f"'partial-progress.enabled', 'true'{extra})"
    )
    strategy = "'sort'" if table.java.sortOrder().isSorted() else "'binpack'"
    rewrite = _row(
        spark,
        f"CALL {system}.rewrite_data_files(table => {name}, strategy => {strategy}, "
        f"options => {options})",
    )
    result["rewrite"] = {
        "rewritten_data_files": rewrite.get("rewritten_data_files_count", 0),
        "added_data_files": rewrite.get("added_data_files_count", 0),
        "rewritten_bytes": rewrite.get("rewritten_bytes_count", 0),
        "removed_delete_files": rewrite.get("removed_delete_files_count", 0),
    }
    report(
        f"compacted {result['rewrite']['rewritten_data_files']} file(s) into "
        f"{result['rewrite']['added_data_files']}"
        + (
            f", {result['rewrite']['removed_delete_files']} delete file(s) dropped"
            if deletes
            else ""
        )
    )
    _check_boundary(before, table.boundary())
    if deletes:
        rewritten = _row(
            spark,
            f"CALL {system}.rewrite_position_delete_files(table => {name}, "
            "options => map('rewrite-all', 'true'))",
        )
        result["rewrite_deletes"] = {
            "rewritten_delete_files": rewritten.get("rewritten_delete_files_count", 0),
            "added_delete_files": rewritten.get("added_delete_files_count", 0),
        }
        report(
            f"rewrote {result['rewrite_deletes']['rewritten_delete_files']} delete file(s) into "
            f"{result['rewrite_deletes']['added_delete_files']}"
        )
        _check_boundary(before, table.boundary())

    now = dt.datetime.now(dt.UTC)
    expire_before = _expire_before(table, settings.snapshot_retention_hours, now)
    expired = _row(
        spark,
        f"CALL {system}.expire_snapshots(table => {name}, "
        f"older_than => {_sql_timestamp(expire_before)}, retain_last => {settings.retain_last})",
    )
    result["expire"] = {
        "older_than": expire_before.isoformat(),
        "deleted_data_files": expired.get("deleted_data_files_count", 0),
        "deleted_manifest_files": expired.get("deleted_manifest_files_count", 0),
        "deleted_manifest_lists": expired.get("deleted_manifest_lists_count", 0),
    }
    report(
        f"expired snapshots older than {expire_before:%Y-%m-%d %H:%M:%S} UTC: "
        f"{result['expire']['deleted_data_files']} data file(s) deleted"
    )
    _check_boundary(before, table.boundary())

    min_age = orphan_min_age_hours
    if min_age is None:
        min_age = settings.orphan_min_age_hours
    orphans_before = now - dt.timedelta(hours=min_age)
    removed = _remove_orphans(spark, table, orphans_before)
    result["orphans"] = {"older_than": orphans_before.isoformat(), "removed_files": removed}
    report(f"removed {len(removed)} orphan file(s) older than {min_age:g} h")

    after = table.boundary()
    _check_boundary(before, after)
    result["boundary_after"] = after
    result["snapshots"] = table.snapshot_count()
    return result
