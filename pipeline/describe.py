"""``bergstream table describe``: a topic table's size, snapshots and boundary, read with
PyIceberg (no JVM), the way ISK and KSI see the table."""

from __future__ import annotations

from typing import Any

from bergstream.core.api import ResolvedLake, TableMode, load_catalog, table_boundary

__all__ = ["TableNotFoundError", "describe_table"]


class TableNotFoundError(LookupError):
    """The topic has no table in the lake's catalog yet."""


def describe_table(
    lake: ResolvedLake, topic: str, mode: TableMode = TableMode.APPEND
) -> dict[str, Any]:
    """JSON-ready facts about the topic's table: ``table``, ``mode``, ``rows``,
    ``data_files``, ``snapshots``, ``boundary`` (partition -> next offset) and more; for an
    upsert or debezium topic (``mode``) its state table's too (``state``: rows, data and delete
    files, deleted positions, boundary), and its rejected table's rows."""
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    catalog = load_catalog(lake)
    identifier = lake.table_identifier(topic)
    try:
        table = catalog.load_table(identifier)
    except (NoSuchTableError, NoSuchNamespaceError):
        raise TableNotFoundError(
            f"table {'.'.join(identifier)} does not exist in catalog '{lake.catalog_name}' "
            f"({lake.catalog_uri}): run `bergstream pipeline run --topic {topic}` first"
        ) from None
    snapshot = table.current_snapshot()
    summary = dict(snapshot.summary.additional_properties) if snapshot and snapshot.summary else {}
    metadata = table.metadata
    described: dict[str, Any] = {
        "table": ".".join(identifier),
        "mode": mode.value,
        "catalog": lake.catalog_name,
        "location": metadata.location,
        "format_version": metadata.format_version,
        "current_snapshot_id": snapshot.snapshot_id if snapshot else None,
        "rows": int(summary.get("total-records", 0)),
        "data_files": int(summary.get("total-data-files", 0)),
        "total_size_bytes": int(summary.get("total-files-size", 0)),
        "snapshots": len(metadata.snapshots),
        "boundary": {str(p): o for p, o in sorted(table_boundary(table).items())},
        "partition_spec": str(table.spec()),
        "sort_order": str(table.sort_order()),
    }
    if mode is not TableMode.APPEND:
        described["state"] = _state(catalog, (lake.current_namespace, topic))
        described["rejected"] = _state(catalog, (lake.rejected_namespace, topic))
    return described


def _state(catalog: Any, identifier: tuple[str, str]) -> dict[str, Any] | None:
    """Rows, files, deletes and boundary of a state (or rejected) table; None if none."""
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    try:
        table = catalog.load_table(identifier)
    except (NoSuchTableError, NoSuchNamespaceError):
        return None
    snapshot = table.current_snapshot()
    summary = dict(snapshot.summary.additional_properties) if snapshot and snapshot.summary else {}

    def count(key: str) -> int:
        return int(summary.get(key, 0))

    return {
        "table": ".".join(identifier),
        "current_snapshot_id": snapshot.snapshot_id if snapshot else None,
        "rows": count("total-records") - count("total-position-deletes"),
        "data_files": count("total-data-files"),
        "delete_files": count("total-delete-files"),
        "deleted_positions": count("total-position-deletes"),
        "total_size_bytes": count("total-files-size"),
        "snapshots": len(table.metadata.snapshots),
        "boundary": {str(p): o for p, o in sorted(table_boundary(table).items())},
    }
