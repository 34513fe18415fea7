"""The history of a ``merged`` table across a pipeline commit: the coldset taking over hot files
is a REPLACE at the previous watermarks (same rows), the new records an APPEND after it, and
every earlier snapshot still reads as it was."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.kits.isk_gateway import attach_spark_catalog, produce, shared_spark, start_gateway
from tests.kits.ksi_stack import lake_yaml, run_pipeline_once
from tests.kits.merged_topic import PARTITIONS, records
from tests.support import consume_rows, sort_rows

pytestmark = pytest.mark.slow


def rows(table: Any, snapshot_id: int | None = None) -> list[dict[str, Any]]:
    scan = table.scan(snapshot_id=snapshot_id) if snapshot_id else table.scan()
    return sort_rows(scan.to_arrow().to_pylist())


def test_a_pipeline_commit_is_a_replace_then_new_records_an_append(
    kafka_bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = new_topic(partitions=PARTITIONS)
    produce(kafka_bootstrap, topic, records(0, 10))
    lake = lake_yaml(tmp_path / "home", kafka_bootstrap)
    gateway = start_gateway(kafka_bootstrap, tmp_path, chunk_records=7, extra=lake)
    try:
        catalog = gateway.catalog()
        before = catalog.load_table(f"merged.{topic}")  # Kafka only: no coldset table yet
        first = before.current_snapshot()
        assert first is not None and first.summary is not None
        first_rows = rows(before)
        assert len(first_rows) == 20

        assert run_pipeline_once(tmp_path / "isk.yaml", topic)
        deadline = time.monotonic() + 60  # ISK reloads the lake's table every few seconds
        while catalog.load_table(f"coldset.{topic}").current_snapshot() is None:
            assert time.monotonic() < deadline, "ISK never saw the pipeline's commit"
            time.sleep(1)
        produce(kafka_bootstrap, topic, records(10, 5))
        everything = consume_rows(kafka_bootstrap, topic, 30)

        table = catalog.load_table(f"merged.{topic}")
        snapshots = table.snapshots()
        operations = [s.summary.operation.value for s in snapshots if s.summary]
        assert operations == ["append", "replace", "append"], operations
        replace, current = snapshots[1], snapshots[2]
        assert replace.parent_snapshot_id == first.snapshot_id
        assert current.parent_snapshot_id == replace.snapshot_id
        assert replace.summary is not None and replace.summary["total-records"] == "20"
        assert current.summary is not None and current.summary["added-records"] == "10"
        # Cold files instead of hot ones, the same rows; the earlier snapshot reads as it was.
        assert rows(table, replace.snapshot_id) == first_rows
        assert rows(table, first.snapshot_id) == first_rows
        assert rows(table) == everything
        files = {
            task.file.file_path for task in table.scan(snapshot_id=replace.snapshot_id).plan_files()
        }
        assert files and all("/files/" in path for path in files)  # all from the coldset
    finally:
        code = gateway.process.stop()
        print(gateway.process.log()[-20000:], file=sys.stderr)
        assert code == 0, f"bergstream run exited with {code}"


def test_spark_streams_the_merged_table_exactly_once_across_a_restart(
    kafka_bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    """A Kafka topic consumed through Iceberg: Spark Structured Streaming reads ``merged`` as
    an Iceberg stream, sees new records batch by batch, skips the pipeline's REPLACE and
    resumes from its checkpoint with every record exactly once."""
    topic = new_topic(partitions=PARTITIONS)
    lake = lake_yaml(tmp_path / "home", kafka_bootstrap)
    gateway = start_gateway(kafka_bootstrap, tmp_path, chunk_records=7, extra=lake)
    checkpoint, sink = tmp_path / "checkpoint", tmp_path / "sink"
    try:
        with shared_spark() as spark:
            table = f"{attach_spark_catalog(spark, gateway.catalog_url)}.merged.`{topic}`"

            def stream() -> None:
                """Run the stream until it has read everything there is, then stop it."""
                query = (
                    spark.readStream.format("iceberg")
                    .table(table)
                    .select("kafka_partition", "kafka_offset", "kafka_value")
                    .writeStream.format("parquet")
                    .option("path", str(sink))
                    .option("checkpointLocation", str(checkpoint))
                    .trigger(processingTime="1 second")
                    .start()
                )
                try:
                    query.processAllAvailable()
                finally:
                    query.stop()

            def seen() -> list[tuple[int, int, bytes | None]]:
                out = spark.read.parquet(str(sink)).collect()
                return sorted(
                    (r.kafka_partition, r.kafka_offset, r.kafka_value and bytes(r.kafka_value))
                    for r in out
                )

            produce(kafka_bootstrap, topic, records(0, 6))
            gateway.catalog().load_table(f"merged.{topic}")  # the first snapshot
            produce(kafka_bootstrap, topic, records(6, 4))
            stream()
            assert len(seen()) == 20
            # The pipeline copies everything the stream saw (a REPLACE: same rows, cold files).
            assert run_pipeline_once(tmp_path / "isk.yaml", topic)
            deadline = time.monotonic() + 60
            while gateway.catalog().load_table(f"coldset.{topic}").current_snapshot() is None:
                assert time.monotonic() < deadline, "ISK never saw the pipeline's commit"
                time.sleep(1)
            produce(kafka_bootstrap, topic, records(10, 5))
            stream()  # a new query from the same checkpoint
            expected = sorted(
                (r["kafka_partition"], r["kafka_offset"], r["kafka_value"])
                for r in consume_rows(kafka_bootstrap, topic, 30)
            )
            assert seen() == expected
            operations = [
                s.summary.operation.value
                for s in gateway.catalog().load_table(f"merged.{topic}").snapshots()
                if s.summary
            ]
            assert "replace" in operations and "overwrite" not in operations, operations
    finally:
        code = gateway.process.stop()
        print(gateway.process.log()[-20000:], file=sys.stderr)
        assert code == 0, f"bergstream run exited with {code}"
