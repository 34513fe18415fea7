"""A Trino table's rows in the row contract, and consumed rows with the same columns (the Trino
tests of this folder compare the two)."""

from __future__ import annotations

from typing import Any

from tests.kits.isk_gateway import in_micros
from tests.kits.trino import TrinoCatalog
from tests.support import sort_rows

# Timestamps as µs since the epoch (exact below 2**53 µs, i.e. until the year 2255); header
# values as hex, because Trino's JSON gives nested varbinary as base64 text.
SELECT_ROWS = (
    "SELECT kafka_partition, kafka_offset, "
    "CAST(round(to_unixtime(kafka_timestamp) * 1000000) AS bigint) AS kafka_timestamp, "
    "kafka_timestamp_type, kafka_key, kafka_value, "
    "transform(kafka_headers, h -> h.key) AS header_keys, "
    "transform(kafka_headers, h -> to_hex(h.value)) AS header_values "
    "FROM {table}"
)


def trino_rows(catalog: TrinoCatalog, table: str) -> list[dict[str, Any]]:
    """``table``'s rows in the row contract (µs timestamps), in (partition, offset) order."""
    rows = []
    for row in catalog.trino.query(SELECT_ROWS.format(table=table)).dicts():
        keys, values = row.pop("header_keys") or [], row.pop("header_values") or []
        row["kafka_headers"] = [
            {"key": key, "value": None if value is None else bytes.fromhex(value)}
            for key, value in zip(keys, values, strict=True)
        ]
        rows.append(row)
    return sort_rows(rows)


def contract(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consumed rows with exactly the columns :func:`trino_rows` gives."""
    columns = (
        "kafka_partition",
        "kafka_offset",
        "kafka_timestamp",
        "kafka_timestamp_type",
        "kafka_key",
        "kafka_value",
        "kafka_headers",
    )
    return [{column: row[column] for column in columns} for row in in_micros(rows)]
