"""Helpers of the ISK end-to-end tests: run the ``isk`` service as ``bergstream run``, produce
records (of every odd kind: :func:`mixed_records`), consume them directly, compare timestamps as
engines show them, and load the DuckDB extensions from their wheels."""

from __future__ import annotations

import contextlib
import datetime as dt
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bergstream.devstack.stack.ports import free_ports
from tests.kits.worker_spark import worker_spark
from tests.support import ProxyProcess, start_bergstream_run

ACCESS_KEY = "isk-test"
SECRET_KEY = "isk-test-secret"
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


@dataclass
class Gateway:
    """A running ``bergstream run`` process serving one ``isk`` service."""

    process: ProxyProcess
    catalog_url: str
    s3_url: str

    def catalog(self) -> Any:
        from pyiceberg.catalog.rest import RestCatalog

        return RestCatalog("isk", uri=self.catalog_url)


def start_gateway(
    kafka_bootstrap: str,
    workdir: Path,
    chunk_records: int,
    extra: str = "",
    index_interval_seconds: float = 0,
    index_yaml: str | None = None,
) -> Gateway:
    """Write a config with free ports under ``workdir`` (plus ``extra`` top-level YAML, e.g. a
    ``lake:`` section) and run it; wait for the ready line. The background indexer is off
    unless ``index_interval_seconds`` is given (tables are indexed when loaded): on the run's
    shared Kafka it would index every topic every test made, a CPU cost growing with the run
    (measured in a CI run: one gateway 420 CPU-s, against 11 alone)."""
    catalog_port, s3_port = free_ports(2)
    config = workdir / "isk.yaml"
    index, cache = workdir / "index.sqlite", workdir / "cache"
    index_yaml = index_yaml or f'{{type: sqlite, config: {{path: "{index}"}}}}'
    config.write_text(
        textwrap.dedent(
            f"""
            services:
              - type: isk
                config:
                  cluster: e2e
                  kafka_bootstrap: "{kafka_bootstrap}"
                  chunk_records: {chunk_records}
                  index_interval_seconds: {index_interval_seconds}
                  http:
                    catalog_port: {catalog_port}
                    s3_port: {s3_port}
                    access_key: {ACCESS_KEY}
                    secret_key: {SECRET_KEY}
                  index: {index_yaml}
                  cache: {{type: local, config: {{directory: "{cache}"}}}}
            """
        )
        + textwrap.dedent(extra)
    )
    running = start_bergstream_run(
        config, kafka_bootstrap, {"BERGSTREAM_HOME": str(workdir / "home")}, "the isk service"
    )
    return Gateway(running, f"http://127.0.0.1:{catalog_port}", f"http://127.0.0.1:{s3_port}")


def stop_gateway(gateway: Gateway) -> None:
    """Stop ``gateway``'s process; its log's end on stderr (pytest shows it when a test
    failed), and a failure if it did not exit cleanly."""
    code = gateway.process.stop()
    print(gateway.process.log()[-20000:], file=sys.stderr)
    assert code == 0, f"bergstream run exited with {code}:\n{gateway.process.log()}"


def produce(bootstrap: str, topic: str, records: list[dict[str, Any]]) -> None:
    """Produce ``records`` (``partition``, ``key``, ``value``, ``headers``) and wait for acks."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
    failures: list[Any] = []

    def delivered(error: Any, _message: Any) -> None:
        if error is not None:
            failures.append(error)

    for record in records:
        producer.produce(topic, on_delivery=delivered, **record)
    assert producer.flush(30) == 0, "records still unacknowledged after 30 s"
    assert not failures, failures


def mixed_records(count: int) -> list[dict[str, Any]]:
    """Null, empty and plain keys; tombstones and empty values; duplicate and null-valued
    headers; two partitions."""
    records = []
    for i in range(count):
        key = (None, b"", b"k%d" % i)[i % 3]
        value = None if i % 5 == 0 else (b"" if i % 7 == 0 else b"v%d" % i)
        headers = [("h", b"1"), ("h", b"2"), ("x", None), ("", b"")][: i % 5]
        records.append({"partition": i % 2, "key": key, "value": value, "headers": headers or None})
    return records


def in_micros(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` (aware UTC datetimes) with ``kafka_timestamp`` as µs since the epoch."""
    return [
        {**row, "kafka_timestamp": (row["kafka_timestamp"] - EPOCH) // dt.timedelta(microseconds=1)}
        for row in rows
    ]


def duckdb_connection() -> Any:
    """An offline DuckDB connection with the iceberg extension loaded (the quickstart's own
    setup); the test fails, naming what to install, if DuckDB or an extension is missing."""
    import pytest

    from bergstream.devstack.quickstart.clients import MissingExtraError, offline_duckdb

    try:
        return offline_duckdb()
    except MissingExtraError as error:
        pytest.fail(str(error))


def attach_isk(connection: Any, catalog_url: str) -> None:
    """ATTACH the ISK catalog at ``catalog_url`` as ``isk`` (no auth)."""
    from bergstream.devstack.quickstart.clients import SqlSession

    connection.execute(SqlSession.attach_sql(catalog_url))


def attach_spark_catalog(spark: Any, catalog_url: str) -> str:
    """Attach the ISK REST catalog at ``catalog_url`` to ``spark`` under a fresh name (S3
    settings come only from each table's vended config); the name."""
    import uuid

    name = f"isk_{uuid.uuid4().hex[:8]}"
    prefix = f"spark.sql.catalog.{name}"
    spark.conf.set(prefix, "org.apache.iceberg.spark.SparkCatalog")
    spark.conf.set(f"{prefix}.type", "rest")
    spark.conf.set(f"{prefix}.uri", catalog_url)
    spark.conf.set(f"{prefix}.io-impl", "org.apache.iceberg.aws.s3.S3FileIO")
    spark.conf.set(f"{prefix}.cache-enabled", "false")
    return name


@contextlib.contextmanager
def shared_spark() -> Iterator[Any]:
    """The test process's one Spark session (:func:`~tests.kits.worker_spark.worker_spark`),
    which the in-process pipeline runs use too; left running for the next test."""
    yield worker_spark()
