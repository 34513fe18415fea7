"""``bergstream table describe``: a topic table's size, snapshots and boundary, read with
PyIceberg (no JVM), the way ISK and KSI see the table."""

from __future__ import annotations

from typing import Any

from bergstream.core.api import ResolvedLake, load_catalog, table_boundary

__all__ = ["TableNotFoundError", "describe_table"]


class TableNotFoundError(LookupError):
    """The topic has no table in the lake's catalog yet."""


def describe_table(lake: ResolvedLake, topic: str) -> dict[str, Any]:
    """JSON-ready facts about the topic's table: ``table``, ``rows``, ``data_files``,
    ``snapshots``, ``boundary`` (partition -> next offset) and more."""
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
    return {
        "table": ".".join(identifier),
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
