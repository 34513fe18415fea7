"""Pruning: a query on one hour of a day-long topic makes the gateway read a small part of the
Kafka bytes a full scan makes it read, and returns the right rows. Measured with the gateway's
own counter (``bergstream_isk_kafka_read_bytes{purpose="serve"}``: record-batch bytes read from
Kafka to build data files a client asked for), through the REST catalog and the S3 gateway, with
an empty file cache before each query so every data file read is a Kafka read."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from bergstream.plugins.cache_backends.local_disk import LocalDiskCache
from bergstream.plugins.index_backends.sqlite_index import SqliteIndex
from bergstream.plugins.isk_gateway.http.server import IskHttpConfig, IskHttpService
from bergstream.plugins.isk_gateway.kafka.reader import KafkaReader
from bergstream.plugins.isk_gateway.tables.hotset import HotsetProvider
from bergstream.plugins.isk_gateway.tables.router import NamespaceRouter
from bergstream.plugins.isk_gateway.tables.store import FileStore

pytestmark = pytest.mark.slow

CLUSTER = "prune"
RECORDS = 2880  # one every 30 s over 24 h
DAY_START = dt.datetime(2024, 5, 1, tzinfo=dt.UTC)


def produce_in_small_batches(bootstrap: str, topic: str, start_ms: int) -> None:
    """The day's records in batches of 10 (Kafka serves whole batches: a batch larger than a
    chunk would be read once per chunk, whatever the pruning)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "batch.num.messages": 10})
    for i in range(RECORDS):
        value = b"payment-%05d-" % i + b"x" * 200
        producer.produce(topic, value=value, timestamp=start_ms + 30_000 * i)
    assert producer.flush(30) == 0


def served_bytes() -> float:
    value = REGISTRY.get_sample_value(
        "bergstream_isk_kafka_read_bytes_total", {"cluster": CLUSTER, "purpose": "serve"}
    )
    return value or 0.0


async def gateway(reader: KafkaReader, index: SqliteIndex, cache_dir: Path) -> IskHttpService:
    cache = LocalDiskCache(cache_dir, 1 << 30)
    store = FileStore(cache)
    hotset = HotsetProvider(
        reader, index, cache, bucket="gateway", cluster=CLUSTER, chunk_records=30, store=store
    )
    config = IskHttpConfig(
        catalog_port=0, s3_port=0, access_key="k", secret_key="s", bucket="gateway"
    )
    http = IskHttpService(config, NamespaceRouter({"hotset": hotset}, store))
    await http.start()
    return http


def query(catalog_url: str, table: str, hour: int | None) -> list[dict[str, Any]]:
    from pyiceberg.catalog.rest import RestCatalog
    from pyiceberg.expressions import And, GreaterThanOrEqual, LessThan

    loaded = RestCatalog("isk", uri=catalog_url).load_table(table)
    if hour is None:
        return loaded.scan().to_arrow().to_pylist()
    low = DAY_START + dt.timedelta(hours=hour)
    high = low + dt.timedelta(hours=1)
    row_filter = And(
        GreaterThanOrEqual("kafka_timestamp", low.isoformat()),
        LessThan("kafka_timestamp", high.isoformat()),
    )
    return loaded.scan(row_filter=row_filter).to_arrow().to_pylist()


async def test_one_hour_reads_a_small_part_of_the_kafka_bytes(
    kafka_bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = new_topic(partitions=1)
    start_ms = int(DAY_START.timestamp() * 1000)
    produce_in_small_batches(kafka_bootstrap, topic, start_ms)
    async with KafkaReader(kafka_bootstrap) as reader:
        index = SqliteIndex(tmp_path / "index.db")
        first = await gateway(reader, index, tmp_path / "cache-0")
        try:  # the first load builds the index
            rows = await asyncio.to_thread(query, first.catalog_url, f"hotset.{topic}", None)
            assert len(rows) == RECORDS
        finally:
            await first.stop()

        hour_gateway = await gateway(reader, index, tmp_path / "cache-1")
        try:
            before = served_bytes()
            hour_rows = await asyncio.to_thread(
                query, hour_gateway.catalog_url, f"hotset.{topic}", 13
            )
            hour_bytes = served_bytes() - before
        finally:
            await hour_gateway.stop()

        full_gateway = await gateway(reader, index, tmp_path / "cache-2")
        try:
            before = served_bytes()
            full_rows = await asyncio.to_thread(
                query, full_gateway.catalog_url, f"hotset.{topic}", None
            )
            full_bytes = served_bytes() - before
        finally:
            await full_gateway.stop()
        index.close()

    assert len(full_rows) == RECORDS
    assert sorted(r["kafka_offset"] for r in hour_rows) == list(range(13 * 120, 14 * 120))
    assert full_bytes > 0
    # 1 hour of 24, chunks of 15 minutes: the hour touches 4 chunks of 96 (+1 read ahead)
    assert 0 < hour_bytes <= full_bytes / 10, (hour_bytes, full_bytes)
    print(f"pruning: one hour read {hour_bytes:.0f} of {full_bytes:.0f} Kafka bytes")
