"""ISK run from ``examples/isk-shared-cache.yaml`` (s3 cache + sqlite index) and
``examples/isk-redis-rocksdb.yaml`` (redis cache + rocksdb index), as ``bergstream run``
processes over the session's Kafka: PyIceberg and DuckDB read ``hotset.<topic>``; two gateways
sharing the s3 cache serve identical bytes; killing the cache's server while a gateway serves
costs misses, not failures, and the cache is used again once it is back."""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from minio import Minio

from bergstream.devstack.stack.ports import free_ports
from tests.backends.servers import OwnServer, S3Settings
from tests.kits.isk_gateway import Gateway, attach_isk, duckdb_connection, produce
from tests.support import REPO, consume_rows, sort_rows, start_bergstream_run, wait_until

pytestmark = pytest.mark.slow

SHARED = REPO / "examples" / "isk-shared-cache.yaml"
REDIS_ROCKSDB = REPO / "examples" / "isk-redis-rocksdb.yaml"
ISK_KEYS = ("isk-demo", "isk-demo-secret")  # the examples' default key pair
CACHE_BUCKET = "bergstream-test-isk-cache"


def records(count: int, tag: str = "v") -> list[dict[str, Any]]:
    """Null and plain keys, tombstones, headers; two partitions."""
    return [
        {
            "partition": i % 2,
            "key": None if i % 3 == 0 else b"k%d" % i,
            "value": None if i % 5 == 0 else f"{tag}{i}".encode(),
            "headers": [("h", b"%d" % i)] if i % 4 == 0 else None,
        }
        for i in range(count)
    ]


@dataclass
class ExampleGateway(Gateway):
    """A gateway run from an example config, with its home directory."""

    home: Path = Path()


@pytest.fixture
def run_example(kafka_bootstrap: str, tmp_path: Path) -> Iterator[Callable[..., ExampleGateway]]:
    """Start ``bergstream run -c <example>`` with the given environment (on top of Kafka, free
    ports, a home of its own and chunks of 8 offsets)."""
    started: list[ExampleGateway] = []

    def start(example: Path, **env: str) -> ExampleGateway:
        catalog_port, s3_port = free_ports(2)
        home = tmp_path / f"home-{catalog_port}"
        base = {k: v for k, v in os.environ.items() if not k.startswith("BERGSTREAM_")}
        full = {
            **base,
            "BERGSTREAM_HOME": str(home),
            "BERGSTREAM_KAFKA_BOOTSTRAP": kafka_bootstrap,
            "BERGSTREAM_ISK_CATALOG_PORT": str(catalog_port),
            "BERGSTREAM_ISK_S3_PORT": str(s3_port),
            "BERGSTREAM_ISK_CHUNK_RECORDS": "8",
            **env,
        }
        process = start_bergstream_run(example, kafka_bootstrap, full, f"isk from {example.name}")
        gateway = ExampleGateway(
            process, f"http://127.0.0.1:{catalog_port}", f"http://127.0.0.1:{s3_port}", home
        )
        started.append(gateway)
        return gateway

    yield start
    for gateway in started:
        code = gateway.process.stop()
        assert code == 0, f"bergstream run exited with {code}:\n{gateway.process.log()}"


def scan(gateway: Gateway, topic: str) -> list[dict[str, Any]]:
    """A fresh LoadTable of ``hotset.<topic>`` scanned by PyIceberg (a failure carries the
    gateway's log)."""
    try:
        table = gateway.catalog().load_table(f"hotset.{topic}")
        return sort_rows(table.scan().to_arrow().to_pylist())
    except Exception as error:
        raise AssertionError(f"scan failed: {error}\n{gateway.process.log()[-6000:]}") from error


def duckdb_summary(gateway: Gateway, topic: str) -> tuple[int, int, int]:
    """``count(*)``, ``count(kafka_value)``, ``sum(kafka_offset)`` as DuckDB reads the table."""
    connection = duckdb_connection()
    try:
        attach_isk(connection, gateway.catalog_url)
        row = connection.execute(
            f'SELECT count(*), count(kafka_value), sum(kafka_offset) FROM isk.hotset."{topic}"'
        ).fetchone()
    finally:
        connection.close()
    assert row is not None
    return row[0], row[1], row[2]


def check_acceptance(gateway: Gateway, bootstrap: str, topic: str, count: int) -> None:
    """PyIceberg and DuckDB both read exactly what Kafka holds; same state, same metadata."""
    expected = consume_rows(bootstrap, topic, count)
    assert scan(gateway, topic) == expected
    summary = duckdb_summary(gateway, topic)
    assert summary == (
        len(expected),
        sum(row["kafka_value"] is not None for row in expected),
        sum(row["kafka_offset"] for row in expected),
    )
    first = gateway.catalog().load_table(f"hotset.{topic}")
    second = gateway.catalog().load_table(f"hotset.{topic}")
    assert first.metadata_location == second.metadata_location


def s3_objects(settings: S3Settings, bucket: str, prefix: str) -> list[str]:
    """Names of the objects under ``prefix`` (none if the bucket does not exist yet)."""
    client = settings.client()
    if not client.bucket_exists(bucket):
        return []
    return [
        o.object_name
        for o in client.list_objects(bucket, prefix=prefix, recursive=True)
        if o.object_name and not o.is_dir
    ]


def redis_keys(url: str, prefix: str) -> list[bytes]:
    """Keys under ``prefix`` in the Redis at ``url``."""
    client = redis.Redis.from_url(url, socket_connect_timeout=1)
    try:
        return list(client.scan_iter(match=f"{prefix}*", count=1000))
    finally:
        client.close()


def s3_env(settings: S3Settings, prefix: str) -> dict[str, str]:
    """The variables ``examples/isk-shared-cache.yaml`` reads for its cache."""
    return {
        "BERGSTREAM_S3_ENDPOINT": settings.endpoint,
        "BERGSTREAM_S3_ACCESS_KEY": settings.access_key,
        "BERGSTREAM_S3_SECRET_KEY": settings.secret_key,
        "BERGSTREAM_S3_REGION": settings.region,
        "BERGSTREAM_ISK_CACHE_BUCKET": CACHE_BUCKET,
        "BERGSTREAM_ISK_CACHE_PREFIX": prefix,
    }


# --------------------------------------------------------------------------- acceptance


def test_shared_cache_example_serves_pyiceberg_and_duckdb(
    run_example: Callable[..., ExampleGateway],
    s3_settings: S3Settings,
    kafka_bootstrap: str,
    new_topic: Callable[..., str],
) -> None:
    prefix = f"{uuid.uuid4().hex}/"
    gateway = run_example(SHARED, **s3_env(s3_settings, prefix))
    topic = new_topic(partitions=2)
    produce(kafka_bootstrap, topic, records(45))
    check_acceptance(gateway, kafka_bootstrap, topic, 45)
    names = s3_objects(s3_settings, CACHE_BUCKET, prefix)
    assert any(name.endswith(".parquet") for name in names), names
    assert any(name.endswith(".metadata.json") for name in names), names


def test_redis_rocksdb_example_serves_pyiceberg_and_duckdb(
    run_example: Callable[..., ExampleGateway],
    redis_url: str,
    kafka_bootstrap: str,
    new_topic: Callable[..., str],
) -> None:
    prefix = f"bergstream-test:{uuid.uuid4().hex}:"
    gateway = run_example(
        REDIS_ROCKSDB, BERGSTREAM_REDIS_URL=redis_url, BERGSTREAM_ISK_CACHE_PREFIX=prefix
    )
    topic = new_topic(partitions=2)
    produce(kafka_bootstrap, topic, records(45))
    check_acceptance(gateway, kafka_bootstrap, topic, 45)
    keys = [key.decode() for key in redis_keys(redis_url, prefix)]
    assert any(key.endswith(".parquet") for key in keys), keys
    assert (gateway.home / "isk" / "index.rocksdb" / "CURRENT").is_file()


# --------------------------------------------------------------------------- two gateways


def _gateway_s3(gateway: Gateway) -> Minio:
    return Minio(
        gateway.s3_url.removeprefix("http://"),
        access_key=ISK_KEYS[0],
        secret_key=ISK_KEYS[1],
        secure=False,
        region="us-east-1",
    )


def _table_files(gateway: Gateway, topic: str) -> tuple[str, list[str]]:
    """The metadata location and every file key (metadata, manifest list, manifests, data)
    of a fresh LoadTable."""
    table = gateway.catalog().load_table(f"hotset.{topic}")
    locations = [table.metadata_location]
    snapshot = table.current_snapshot()
    assert snapshot is not None
    locations.append(snapshot.manifest_list)
    locations += [m.manifest_path for m in snapshot.manifests(table.io)]
    locations += [task.file.file_path for task in table.scan().plan_files()]
    keys = []
    for location in locations:
        found = re.match(r"s3a?://bergstream/(.+)$", location)
        assert found, location
        keys.append(found.group(1))
    return table.metadata_location, keys


def _read(client: Minio, key: str) -> bytes:
    response = client.get_object("bergstream", key)
    try:
        return response.read()
    finally:
        response.close()
        response.release_conn()


def test_two_gateways_sharing_the_s3_cache_serve_identical_bytes(
    run_example: Callable[..., ExampleGateway],
    s3_settings: S3Settings,
    kafka_bootstrap: str,
    new_topic: Callable[..., str],
) -> None:
    prefix = f"{uuid.uuid4().hex}/"
    first = run_example(SHARED, **s3_env(s3_settings, prefix))
    second = run_example(SHARED, **s3_env(s3_settings, prefix))
    topic = new_topic(partitions=2)
    produce(kafka_bootstrap, topic, records(37))

    location, keys = _table_files(first, topic)
    assert len(keys) >= 5 and any(k.endswith(".parquet") for k in keys)
    from_first = {key: _read(_gateway_s3(first), key) for key in keys}
    # The second gateway has built nothing yet: the metadata, manifest list and manifests the
    # first one built can only come from the shared cache.
    from_second = {key: _read(_gateway_s3(second), key) for key in keys}
    assert from_second == from_first

    second_location, second_keys = _table_files(second, topic)
    assert second_location == location and sorted(second_keys) == sorted(keys)
    assert {key: _read(_gateway_s3(second), key) for key in keys} == from_first
    assert scan(second, topic) == scan(first, topic) == consume_rows(kafka_bootstrap, topic, 37)


# --------------------------------------------------------------------------- outages


def _failure_lines(gateway: Gateway, name: str) -> list[str]:
    return [
        line
        for line in gateway.process.log().splitlines()
        if f"cache backend {name!r} failed" in line
    ]


def _recovered(gateway: Gateway, name: str) -> bool:
    return f"cache backend {name!r} works again" in gateway.process.log()


def _serve_through_an_outage(
    gateway: Gateway,
    server: OwnServer,
    name: str,
    bootstrap: str,
    topic: str,
    cached: Callable[[], int],
    writable: Callable[[], bool],
) -> None:
    produce(bootstrap, topic, records(30, "before"))
    assert scan(gateway, topic) == consume_rows(bootstrap, topic, 30)
    assert cached() > 0
    assert not _failure_lines(gateway, name)

    server.stop()
    produce(bootstrap, topic, records(20, "during"))
    for _ in range(3):  # every query succeeds, files synthesized again
        assert scan(gateway, topic) == consume_rows(bootstrap, topic, 50)
    assert len(_failure_lines(gateway, name)) == 1, gateway.process.log()

    server.start()
    wait_until(writable, 60)
    before = cached()
    produce(bootstrap, topic, records(10, "after"))

    def used_again() -> bool:
        assert scan(gateway, topic) == consume_rows(bootstrap, topic, 60)
        return _recovered(gateway, name) and cached() > before

    wait_until(used_again, 60, interval=1.0)


def test_the_gateway_serves_while_its_redis_is_killed(
    run_example: Callable[..., ExampleGateway],
    kafka_bootstrap: str,
    new_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    server = OwnServer(tmp_path / "redis-home", "redis")
    env = server.start()
    try:
        assert env.redis_url is not None
        url = env.redis_url
        gateway = run_example(REDIS_ROCKSDB, BERGSTREAM_REDIS_URL=url)

        def writable() -> bool:
            try:
                client = redis.Redis.from_url(url, socket_connect_timeout=1)
                client.set("probe", b"1")
                client.close()
                return True
            except redis.RedisError:
                return False

        _serve_through_an_outage(
            gateway,
            server,
            "redis",
            kafka_bootstrap,
            new_topic(partitions=2),
            lambda: len(redis_keys(url, "bergstream:isk:")),
            writable,
        )
    finally:
        server.stop()


def test_the_gateway_serves_while_its_s3_server_is_killed(
    run_example: Callable[..., ExampleGateway],
    kafka_bootstrap: str,
    new_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    server = OwnServer(tmp_path / "s3-home", "s3")
    env = server.start()
    try:
        settings = S3Settings.from_env(env.as_dict())
        prefix = "isk/"
        gateway = run_example(SHARED, **s3_env(settings, prefix))

        def writable() -> bool:
            try:
                client = settings.client(read_timeout=5.0)
                if not client.bucket_exists("probe"):
                    client.make_bucket("probe")
                import io

                client.put_object("probe", "k", io.BytesIO(b"1"), 1)
                return True
            except Exception:
                return False

        _serve_through_an_outage(
            gateway,
            server,
            "s3",
            kafka_bootstrap,
            new_topic(partitions=2),
            lambda: len(s3_objects(settings, CACHE_BUCKET, prefix)),
            writable,
        )
    finally:
        server.stop()
