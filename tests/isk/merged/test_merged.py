"""``hotset``, ``coldset`` and ``merged`` of one topic, half of it copied into the coldset by the
pipeline and the oldest part deleted from Kafka, read through ``bergstream run``'s ``isk``
service by PyIceberg, DuckDB, ClickHouse and Spark, unmodified."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.kits.clickhouse import clickhouse_rows
from tests.kits.isk_gateway import attach_isk, duckdb_connection, produce, shared_spark
from tests.kits.merged_topic import COLD, DELETED, Stage, pyiceberg_rows, run_merged_stage

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stage(
    kafka_bootstrap: str,
    new_topic: Callable[..., str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stage]:
    yield from run_merged_stage(kafka_bootstrap, new_topic, tmp_path_factory)


def test_namespaces_and_tables_are_listed(stage: Stage) -> None:
    catalog = stage.gateway.catalog()
    assert {("hotset",), ("coldset",), ("merged",)} <= set(catalog.list_namespaces())
    for namespace in ("hotset", "coldset", "merged"):
        assert (namespace, stage.topic) in catalog.list_tables(namespace)


def test_pyiceberg_reads_each_namespace(stage: Stage) -> None:
    cold = [r for r in stage.all_rows if r["kafka_offset"] < COLD]
    hot = [r for r in stage.all_rows if r["kafka_offset"] >= DELETED]
    assert pyiceberg_rows(stage, "coldset") == cold
    assert pyiceberg_rows(stage, "hotset") == hot
    merged = pyiceberg_rows(stage, "merged")
    assert merged == stage.all_rows  # cold below the boundary, Kafka above it, no duplicate
    assert len({(r["kafka_partition"], r["kafka_offset"]) for r in merged}) == len(merged)


def test_merged_snapshot_records_the_boundary_and_is_stable(stage: Stage) -> None:
    first = stage.gateway.catalog().load_table(f"merged.{stage.topic}")
    second = stage.gateway.catalog().load_table(f"merged.{stage.topic}")
    assert first.metadata_location == second.metadata_location
    assert first.metadata == second.metadata
    summary = first.metadata.current_snapshot().summary
    assert summary["bergstream.kafka-offsets"] == f'{{"0":{COLD},"1":{COLD}}}'
    assert summary["total-records"] == str(len(stage.all_rows))


def test_merged_pruning_by_offset_reads_only_hot_files(stage: Stage) -> None:
    from pyiceberg.expressions import GreaterThanOrEqual

    table = stage.gateway.catalog().load_table(f"merged.{stage.topic}")
    tasks = list(table.scan(row_filter=GreaterThanOrEqual("kafka_offset", COLD)).plan_files())
    assert tasks and all("/data/p=" in task.file.file_path for task in tasks)
    cold_tasks = list(table.scan(row_filter=GreaterThanOrEqual("kafka_offset", 0)).plan_files())
    assert any("/files/" in task.file.file_path for task in cold_tasks)


def test_zero_lag_on_merged(stage: Stage, kafka_bootstrap: str) -> None:
    from pyiceberg.expressions import EqualTo

    for i in range(100):
        marker = b"now-%d-%s" % (i, uuid.uuid4().hex.encode())
        produce(kafka_bootstrap, stage.topic, [{"partition": i % 2, "value": marker}])
        table = stage.gateway.catalog().load_table(f"merged.{stage.topic}")
        found = table.scan(row_filter=EqualTo("kafka_value", marker)).to_arrow()
        assert found.num_rows == 1, f"round {i}: the record acked before the query is missing"


def test_duckdb_reads_each_namespace(stage: Stage) -> None:
    connection = duckdb_connection()
    try:
        attach_isk(connection, stage.gateway.catalog_url)
        counts = {}
        for namespace in ("coldset", "hotset", "merged"):
            counts[namespace] = connection.execute(
                "SELECT count(*), count(DISTINCT (kafka_partition, kafka_offset)), "
                f'sum(kafka_offset), count(kafka_value) FROM isk.{namespace}."{stage.topic}"'
            ).fetchone()
    finally:
        connection.close()
    merged_now = pyiceberg_rows(stage, "merged")  # zero-lag rounds may have added records
    cold = [r for r in merged_now if r["kafka_offset"] < COLD]
    hot = [r for r in merged_now if r["kafka_offset"] >= DELETED]

    def expected(rows: list[dict[str, Any]]) -> tuple[int, int, int, int]:
        values = sum(r["kafka_value"] is not None for r in rows)
        return (len(rows), len(rows), sum(r["kafka_offset"] for r in rows), values)

    assert counts["coldset"] == expected(cold)
    assert counts["hotset"] == expected(hot)
    assert counts["merged"] == expected(merged_now)


def test_clickhouse_reads_each_namespace(stage: Stage) -> None:
    """ClickHouse (chDB, its DataLakeCatalog database engine) reads all three tables."""
    namespaces = ("coldset", "hotset", "merged")
    answers = clickhouse_rows(
        stage.gateway,
        [
            "SELECT count(), uniqExact(kafka_partition, kafka_offset), sum(kafka_offset), "
            f"count(kafka_value) FROM isk.`{namespace}.{stage.topic}`"
            for namespace in namespaces
        ],
    )
    counts = {namespace: rows[0] for namespace, rows in zip(namespaces, answers, strict=True)}
    merged_now = pyiceberg_rows(stage, "merged")
    cold = [r for r in merged_now if r["kafka_offset"] < COLD]
    hot = [r for r in merged_now if r["kafka_offset"] >= DELETED]

    def expected(rows: list[dict[str, Any]]) -> tuple[int, int, int, int]:
        values = sum(r["kafka_value"] is not None for r in rows)
        return (len(rows), len(rows), sum(r["kafka_offset"] for r in rows), values)

    assert tuple(int(v) for v in counts["coldset"]) == expected(cold)
    assert tuple(int(v) for v in counts["hotset"]) == expected(hot)
    assert tuple(int(v) for v in counts["merged"]) == expected(merged_now)


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    """The run's one Spark session."""
    with shared_spark() as session:
        yield session


def test_spark_reads_each_namespace_and_metadata_tables(spark: Any, stage: Stage) -> None:
    name = f"isk_{uuid.uuid4().hex[:8]}"
    prefix = f"spark.sql.catalog.{name}"
    spark.conf.set(prefix, "org.apache.iceberg.spark.SparkCatalog")
    spark.conf.set(f"{prefix}.type", "rest")
    spark.conf.set(f"{prefix}.uri", stage.gateway.catalog_url)
    spark.conf.set(f"{prefix}.io-impl", "org.apache.iceberg.aws.s3.S3FileIO")
    spark.conf.set(f"{prefix}.cache-enabled", "false")
    merged_now = pyiceberg_rows(stage, "merged")
    sums = {}
    for namespace in ("coldset", "hotset", "merged"):
        table = f"{name}.{namespace}.`{stage.topic}`"
        row = spark.sql(
            "SELECT count(*) AS n, count(DISTINCT kafka_partition, kafka_offset) AS d, "
            f"sum(kafka_offset) AS s FROM {table}"
        ).first()
        sums[namespace] = (row.n, row.d, row.s)
    cold = [r for r in merged_now if r["kafka_offset"] < COLD]
    hot = [r for r in merged_now if r["kafka_offset"] >= DELETED]
    for namespace, rows in (("coldset", cold), ("hotset", hot), ("merged", merged_now)):
        offsets = sum(r["kafka_offset"] for r in rows)
        assert sums[namespace] == (len(rows), len(rows), offsets), namespace
    table = f"{name}.merged.`{stage.topic}`"
    # Every state served so far is a snapshot (the zero-lag test served 100), the newest last.
    snapshots = spark.sql(
        f"SELECT snapshot_id FROM {table}.snapshots ORDER BY committed_at"
    ).collect()
    current = stage.gateway.catalog().load_table(f"merged.{stage.topic}").current_snapshot()
    assert len(snapshots) > 1 and snapshots[-1].snapshot_id == current.snapshot_id
    files = spark.sql(f"SELECT file_path, record_count FROM {table}.files").collect()
    assert sum(f.record_count for f in files) == len(merged_now)
    assert any("/files/" in f.file_path for f in files)
    assert any("/data/p=" in f.file_path for f in files)
