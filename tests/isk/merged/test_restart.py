"""The index outlives the gateway and is built in the background; metadata files handed out
before a restart with an empty cache are served again (rebuilt from the same state)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bergstream.plugins.index_backends.sqlite_index import SqliteIndex
from bergstream.plugins.isk_gateway.files.hotset_layout import layout_name
from bergstream.plugins.isk_gateway.tables.paths import DAY
from tests.kits.isk_gateway import ACCESS_KEY, SECRET_KEY, Gateway, produce, start_gateway
from tests.support import consume_rows, sort_rows

pytestmark = pytest.mark.slow


def s3_get(gateway: Gateway, location: str) -> bytes:
    import boto3

    bucket, _, key = location.removeprefix("s3://").partition("/")
    client = boto3.client(
        "s3",
        endpoint_url=gateway.s3_url,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        region_name="us-east-1",
    )
    return client.get_object(Bucket=bucket, Key=key)["Body"].read()  # type: ignore[no-any-return]


def stop(gateway: Gateway) -> None:
    assert gateway.process.stop() == 0, gateway.process.log()


def test_background_indexing_without_any_query(
    kafka_bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    """The gateway sees every topic of the session's Kafka: chunks of 1,000 keep the other
    topics' share of each pass small, and each topic gets at most a few chunks per pass."""
    topic = new_topic(partitions=2)
    records = [{"partition": i % 2, "value": b"%d" % i} for i in range(5000)]
    produce(kafka_bootstrap, topic, records)
    gateway = start_gateway(
        kafka_bootstrap, tmp_path, chunk_records=1000, index_interval_seconds=0.5
    )
    try:
        index = SqliteIndex(tmp_path / "index.sqlite")
        try:
            deadline = time.monotonic() + 240
            while True:
                chunks = [index.chunks(f"{topic}#{layout_name(DAY, 'snappy')}", p) for p in (0, 1)]
                ends = [max((c.end_offset for c in found), default=0) for found in chunks]
                if ends == [2000, 2000]:  # 2,500 offsets per partition: 2 sealed chunks
                    break
                assert time.monotonic() < deadline, f"index not built in the background: {ends}"
                time.sleep(0.5)
        finally:
            index.close()
        deadline = time.monotonic() + 60
        while f"index of {topic} brought up to date" not in gateway.process.log():
            assert time.monotonic() < deadline, gateway.process.log()[-3000:]
            time.sleep(0.2)
    finally:
        stop(gateway)
    assert f"indexing {topic}: 5000 offsets not in the index yet" in gateway.process.log()


def test_metadata_from_before_a_restart_is_served_after_it(
    kafka_bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = new_topic(partitions=2)
    produce(kafka_bootstrap, topic, [{"partition": i % 2, "value": b"%d" % i} for i in range(30)])
    expected = consume_rows(kafka_bootstrap, topic, 30)
    first = start_gateway(kafka_bootstrap, tmp_path, chunk_records=4)
    try:
        table = first.catalog().load_table(f"hotset.{topic}")
        location = table.metadata_location
        before = s3_get(first, location)
    finally:
        stop(first)
    shutil.rmtree(tmp_path / "cache")  # a restart with an empty cache, the same index
    second = start_gateway(kafka_bootstrap, tmp_path, chunk_records=4)
    try:
        assert s3_get(second, location) == before
        from pyiceberg.table import StaticTable

        static = StaticTable.from_metadata(
            location,
            {
                "s3.endpoint": second.s3_url,
                "s3.access-key-id": ACCESS_KEY,
                "s3.secret-access-key": SECRET_KEY,
                "s3.region": "us-east-1",
                "s3.path-style-access": "true",
            },
        )
        assert sort_rows(static.scan().to_arrow().to_pylist()) == expected
    finally:
        stop(second)


def test_switching_the_index_backend_rebuilds_it_with_progress(
    kafka_bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    """No migration: a gateway on a new (empty) index backend indexes Kafka again by itself,
    saying so in its log, and serves the same table."""
    topic = new_topic(partitions=2)
    produce(kafka_bootstrap, topic, [{"partition": i % 2, "value": b"%d" % i} for i in range(5000)])
    expected = consume_rows(kafka_bootstrap, topic, 5000)
    first = start_gateway(kafka_bootstrap, tmp_path, chunk_records=1000)
    try:
        assert (
            sort_rows(first.catalog().load_table(f"hotset.{topic}").scan().to_arrow().to_pylist())
            == expected
        )
    finally:
        stop(first)
    rocks = tmp_path / "rocks-index"
    second = start_gateway(
        kafka_bootstrap,
        tmp_path,
        chunk_records=1000,
        index_interval_seconds=0.5,
        index_yaml=f'{{type: rocksdb, config: {{path: "{rocks}"}}}}',
    )
    try:
        deadline = time.monotonic() + 240
        while f"index of {topic} brought up to date" not in second.process.log():
            assert time.monotonic() < deadline, second.process.log()[-3000:]
            time.sleep(0.2)
        rows = second.catalog().load_table(f"hotset.{topic}").scan().to_arrow().to_pylist()
        assert sort_rows(rows) == expected
    finally:
        stop(second)
    assert f"indexing {topic}: 5000 offsets not in the index yet" in second.process.log()
    assert rocks.exists()
