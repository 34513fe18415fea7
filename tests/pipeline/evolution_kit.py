"""Helpers of the schema-evolution tests: copy a topic with the pipeline, and read ISK's
``merged.<topic>`` with PyIceberg, Spark (a REST catalog on the gateway) and DuckDB as rows of
chosen columns, sorted by their first one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bergstream.core.api import VALUE_ERROR_COLUMN
from bergstream.pipeline.settings import PipelineLake
from bergstream.pipeline.stream import run_pipeline
from tests.kits.isk_gateway import Gateway, attach_isk, duckdb_connection
from tests.pipeline.typed_kit import typing_for

Row = tuple[Any, ...]


def by_first(row: Row) -> Any:
    """Sort key: the row's first column (the produced value's unique id)."""
    return row[0]


def copy_all(spark: Any, lake: PipelineLake, topic: str, registry_url: str, home: Path) -> None:
    """One pipeline run copying everything Kafka has of ``topic`` into the coldset."""
    typing = typing_for(home, registry_url, topic)
    run_pipeline(spark, lake, topic, once=True, report=lambda line: None, codecs=typing)


def merged_by_pyiceberg(gateway: Gateway, topic: str, columns: tuple[str, ...]) -> list[Row]:
    """``merged.<topic>`` read by PyIceberg; every value must have decoded canonically."""
    table = gateway.catalog().load_table(f"merged.{topic}")
    rows = table.scan().to_arrow().to_pylist()
    failed = [r for r in rows if r[VALUE_ERROR_COLUMN] is not None or r["kafka_value"] is not None]
    assert not failed, failed[:3]
    return sorted((tuple(r[c] for c in columns) for r in rows), key=by_first)


def _plain(value: Any) -> Any:
    """A Spark value with its structs (``Row``) as dicts, as the other engines give them."""
    from pyspark.sql import Row as SparkRow

    if isinstance(value, SparkRow):
        return {k: _plain(v) for k, v in value.asDict().items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def merged_by_spark(spark: Any, catalog: str, topic: str, columns: tuple[str, ...]) -> list[Row]:
    """``merged.<topic>`` read by Spark through the REST catalog attached as ``catalog``."""
    select = ", ".join(f"`{c}`" for c in columns)
    rows = spark.sql(f"SELECT {select} FROM {catalog}.merged.`{topic}`").collect()
    return sorted((tuple(_plain(v) for v in row) for row in rows), key=by_first)


def merged_by_duckdb(gateway: Gateway, topic: str, columns: tuple[str, ...]) -> list[Row]:
    """``merged.<topic>`` read by DuckDB's iceberg extension through the gateway's catalog."""
    connection = duckdb_connection()
    try:
        attach_isk(connection, gateway.catalog_url)
        select = ", ".join(f'"{c}"' for c in columns)
        rows = connection.execute(f'SELECT {select} FROM isk.merged."{topic}"').fetchall()
    finally:
        connection.close()
    return sorted((tuple(row) for row in rows), key=by_first)


def as_row(value: dict[str, Any], columns: tuple[str, ...]) -> Row:
    """A produced value as ``columns`` (null where its version has no such field)."""
    return tuple(value.get(name) for name in columns)


def check_merged_everywhere(
    spark: Any,
    gateway: Gateway,
    catalog: str,
    topic: str,
    columns: tuple[str, ...],
    expected: list[Row],
) -> None:
    """PyIceberg, Spark and DuckDB each read exactly ``expected`` (by first column) as
    ``columns`` of ``merged.<topic>``."""
    assert merged_by_pyiceberg(gateway, topic, columns) == expected
    assert merged_by_spark(spark, catalog, topic, columns) == expected
    assert merged_by_duckdb(gateway, topic, columns) == expected
