"""ISK over the secured 3-broker stack (SASL_SSL, SCRAM-SHA-512, ACLs): ``bergstream run`` with
the admin's properties file serves a 6-partition topic whose leaders are on all three brokers,
every record exactly once, to PyIceberg and DuckDB, over HTTP and over HTTPS with the CA; a wrong
password is a clear authentication error while ISK stays up. The reader itself follows a moved
leader, a closed connection and expired SASL sessions without an error."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bergstream.core.api import KafkaClientSettings
from bergstream.devstack.stack.env import StackEnv
from bergstream.plugins.isk_gateway.files.synthesis import records_to_table
from bergstream.plugins.isk_gateway.kafka.reader import KafkaReader
from tests.kits.certs import ServerCertificate, write_server_certificate
from tests.kits.isk_gateway import (
    attach_isk,
    attach_spark_catalog,
    duckdb_connection,
    shared_spark,
)
from tests.kits.isk_secure_gateway import Gateway, start_gateway, stop
from tests.kits.ksi_stack import pipeline_once
from tests.support import SECURE_REAUTH_MS, secure_lake_yaml

pytestmark = pytest.mark.slow

PARTITIONS = 6
PER_PARTITION = 10
COLUMNS = "kafka_partition, kafka_offset, kafka_key, kafka_value"


def admin_settings(env: dict[str, str]) -> KafkaClientSettings:
    return KafkaClientSettings.model_validate({"properties_file": env["BERGSTREAM_KAFKA_CONFIG"]})


@pytest.fixture(scope="module")
def topic(secure_stack_env: dict[str, str], new_secure_topic: Callable[..., str]) -> str:
    """A 6-partition topic with ``PER_PARTITION`` records in each, produced as the admin."""
    return make_topic(secure_stack_env, new_secure_topic)


def make_topic(secure_stack_env: dict[str, str], new_secure_topic: Callable[..., str]) -> str:
    """A 6-partition topic, its leaders on all three brokers, with ``PER_PARTITION`` records in
    each, produced as the admin."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient

    name = new_secure_topic(partitions=PARTITIONS)
    config = {
        **admin_settings(secure_stack_env).librdkafka(),
        "bootstrap.servers": secure_stack_env["BERGSTREAM_KAFKA_BOOTSTRAP"],
    }
    leaders = {
        p.leader
        for p in AdminClient(config).list_topics(name, timeout=30).topics[name].partitions.values()
    }
    assert len(leaders) == 3, f"leaders {leaders}: expected the partitions spread over 3 brokers"
    producer = Producer({**config, "acks": "all", "linger.ms": 0})
    failures: list[Any] = []
    for partition in range(PARTITIONS):
        for i in range(PER_PARTITION):
            producer.produce(
                name,
                key=b"k%d" % i,
                value=b"p%d-v%d" % (partition, i),
                partition=partition,
                on_delivery=lambda error, _m: failures.append(error) if error else None,
            )
    assert producer.flush(60) == 0 and not failures, failures
    return name


def expected_rows() -> list[tuple[int, int, bytes, bytes]]:
    return [
        (p, i, b"k%d" % i, b"p%d-v%d" % (p, i))
        for p in range(PARTITIONS)
        for i in range(PER_PARTITION)
    ]


def as_tuples(rows: list[dict[str, Any]]) -> list[tuple[int, int, bytes, bytes]]:
    return sorted(
        (r["kafka_partition"], r["kafka_offset"], r["kafka_key"], r["kafka_value"]) for r in rows
    )


@pytest.fixture(scope="module")
def gateway(
    secure_stack_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    running = start_gateway(
        secure_stack_env,
        tmp_path_factory.mktemp("isk-secure"),
        secure_stack_env["BERGSTREAM_KAFKA_CONFIG"],
    )
    try:
        yield running
    finally:
        stop(running)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> ServerCertificate:
    return write_server_certificate(tmp_path_factory.mktemp("isk-certs"))


@pytest.fixture(scope="module")
def https_gateway(
    secure_stack_env: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
    certs: ServerCertificate,
) -> Iterator[Gateway]:
    running = start_gateway(
        secure_stack_env,
        tmp_path_factory.mktemp("isk-https"),
        secure_stack_env["BERGSTREAM_KAFKA_CONFIG"],
        certs,
    )
    try:
        yield running
    finally:
        stop(running)


def test_pyiceberg_and_duckdb_read_every_record_once(gateway: Gateway, topic: str) -> None:
    from pyiceberg.catalog.rest import RestCatalog

    catalog = RestCatalog("isk", uri=gateway.catalog_url)
    assert ("hotset", topic) in catalog.list_tables("hotset")
    rows = catalog.load_table(f"hotset.{topic}").scan().to_arrow().to_pylist()
    assert as_tuples(rows) == expected_rows()
    connection = duckdb_connection()
    try:
        attach_isk(connection, gateway.catalog_url)
        got = connection.execute(f'SELECT {COLUMNS} FROM isk.hotset."{topic}"').fetchall()
    finally:
        connection.close()
    assert sorted(got) == expected_rows()


# Run in a process of its own: the AWS SDK reads SSL_CERT_FILE once per process, and requests
# prefers REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE from the environment over the catalog's `cabundle`.
HTTPS_CLIENTS = """
import json, sys
from pyiceberg.catalog.rest import RestCatalog
from bergstream.devstack.quickstart.clients import SqlSession, offline_duckdb

catalog_url, ca, topic, columns = sys.argv[1:5]
table = RestCatalog("isk", uri=catalog_url, ssl={"cabundle": ca}).load_table(f"hotset.{topic}")
rows = table.scan().to_arrow().to_pylist()
pyiceberg = [[r[c] if not isinstance(r[c], bytes) else r[c].decode() for c in columns.split(", ")]
             for r in rows]
connection = offline_duckdb()
connection.execute(f"SET ca_cert_file = '{ca}'")
connection.execute(SqlSession.attach_sql(catalog_url))
duck = connection.execute(f'SELECT {columns} FROM isk.hotset."{topic}"').fetchall()
duck = [[v.decode() if isinstance(v, bytes) else v for v in row] for row in duck]
print(json.dumps({"endpoint": table.io.properties["s3.endpoint"], "pyiceberg": pyiceberg,
                  "duckdb": duck}))
"""


def https_clients(gateway: Gateway, ca: Path, topic: str) -> subprocess.CompletedProcess[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE", "AWS_CA_BUNDLE")
    }
    return subprocess.run(
        [sys.executable, "-c", HTTPS_CLIENTS, gateway.catalog_url, str(ca), topic, COLUMNS],
        capture_output=True,
        text=True,
        env={**env, "SSL_CERT_FILE": str(ca)},
        timeout=300,
    )


def test_https_with_the_ca_reads_every_record_once(
    https_gateway: Gateway, certs: ServerCertificate, topic: str
) -> None:
    result = https_clients(https_gateway, certs.ca_file, topic)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["endpoint"] == https_gateway.s3_url and out["endpoint"].startswith("https://")
    expected = [[p, o, k.decode(), v.decode()] for p, o, k, v in expected_rows()]
    assert sorted(out["pyiceberg"]) == expected
    assert sorted(out["duckdb"]) == expected


def test_https_without_the_ca_is_refused(
    https_gateway: Gateway, tmp_path: Path, topic: str
) -> None:
    stranger = write_server_certificate(tmp_path, "stranger")
    result = https_clients(https_gateway, stranger.ca_file, topic)
    assert result.returncode != 0
    assert "CERTIFICATE_VERIFY_FAILED" in result.stderr


def test_a_wrong_password_is_a_clear_error_and_isk_stays_up(
    secure_stack_env: dict[str, str], tmp_path: Path, topic: str
) -> None:
    from pyiceberg.catalog.rest import RestCatalog
    from pyiceberg.exceptions import ServiceUnavailableError

    wrong = "not-the-password-0123"
    lines = Path(secure_stack_env["BERGSTREAM_KAFKA_CONFIG"]).read_text().splitlines()
    properties = tmp_path / "wrong.properties"
    properties.write_text(
        "\n".join(
            f"sasl.password={wrong}" if line.startswith("sasl.password") else line for line in lines
        )
        + "\n"
    )
    started = time.monotonic()
    running = start_gateway(secure_stack_env, tmp_path, properties)
    try:
        catalog = RestCatalog("isk", uri=running.catalog_url)
        for _ in range(2):  # answered each time, the process still serving
            with pytest.raises(ServiceUnavailableError) as caught:
                catalog.load_table(f"hotset.{topic}")
            message = str(caught.value)
            assert "authentication failed" in message and "'admin'" in message, message
            assert wrong not in message
            assert running.process.process.poll() is None
        assert time.monotonic() - started < 120
    finally:
        stop(running)
    log = running.process.log()
    assert "authentication failed" in log and wrong not in log


# ------------------------------------------------------------------- the reader, in process


async def test_reader_follows_a_moved_leader_and_a_closed_connection(
    secure_stack_env: dict[str, str], topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="bergstream.isk")
    settings = admin_settings(secure_stack_env)
    async with KafkaReader(
        secure_stack_env["BERGSTREAM_KAFKA_BOOTSTRAP"], settings=settings
    ) as reader:

        async def read(partition: int) -> list[bytes]:
            fetched = await reader.fetch(topic, partition, 0, PER_PARTITION)
            table = records_to_table(fetched.records, partition, 0, PER_PARTITION, fetched.aborted)
            return table.column("kafka_value").to_pylist()

        offsets = await reader.offsets(topic)
        assert {p: o.last_stable for p, o in offsets.items()} == dict.fromkeys(
            range(PARTITIONS), PER_PARTITION
        )
        values = [b"p0-v%d" % i for i in range(PER_PARTITION)]
        assert await read(0) == values
        assert "retrying" not in caplog.text

        # A stale leader (as after a leader election): the broker asked answers
        # NOT_LEADER_OR_FOLLOWER, the reader refreshes its metadata and asks the leader.
        cluster = reader._client.cluster
        from aiokafka.structs import TopicPartition

        leader = cluster.leader_for_partition(TopicPartition(topic, 0))
        stale = next(b.nodeId for b in cluster.brokers() if b.nodeId != leader)
        cluster._partitions[topic][0] = cluster._partitions[topic][0]._replace(leader=stale)
        assert await read(0) == values
        assert "NotLeaderForPartitionError" in caplog.text
        assert cluster.leader_for_partition(TopicPartition(topic, 0)) == leader

        # Pooled Fetch connections closed under the reader (a broker restarting).
        caplog.clear()
        for connections in reader._fetches._idle.values():
            for connection in connections:
                connection.connection.writer.transport.abort()
        assert await read(0) == values
        assert "closed the connection" in caplog.text

        # The brokers end SASL sessions after SECURE_REAUTH_MS (aiokafka does not
        # re-authenticate): every connection is replaced, no request fails.
        await asyncio.sleep(SECURE_REAUTH_MS / 1000 + 2)
        assert (await reader.offsets(topic))[3].last_stable == PER_PARTITION
        assert await read(3) == [b"p3-v%d" % i for i in range(PER_PARTITION)]


async def test_reader_with_plain_keeps_the_password_out_of_debug_logs(
    secure_stack_env: dict[str, str], topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    settings = KafkaClientSettings.model_validate(
        {"properties_file": secure_stack_env["BERGSTREAM_KAFKA_CONFIG"], "sasl.mechanism": "PLAIN"}
    )
    assert settings.sasl_password is not None
    password = settings.sasl_password.get_secret_value()
    async with KafkaReader(
        secure_stack_env["BERGSTREAM_KAFKA_BOOTSTRAP"], settings=settings
    ) as reader:
        assert (await reader.offsets(topic))[5].last_stable == PER_PARTITION
        fetched = await reader.fetch(topic, 5, 0, PER_PARTITION)
        assert len(records_to_table(fetched.records, 5, 0, PER_PARTITION, ())) == PER_PARTITION
    assert "SaslAuthenticateRequest(sasl_auth_bytes=***)" in caplog.text  # aiokafka's line
    assert password not in caplog.text


def test_merged_reads_the_same_through_pyiceberg_duckdb_and_spark(
    secure_stack: StackEnv,
    secure_stack_env: dict[str, str],
    new_secure_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    """The pipeline copies the topic from the secured cluster into the coldset; then new
    records arrive; ``merged`` holds each record once through PyIceberg, DuckDB and Spark."""
    from confluent_kafka import Producer
    from pyiceberg.catalog.rest import RestCatalog

    topic = make_topic(secure_stack_env, new_secure_topic)
    home = tmp_path / "home"
    gateway = start_gateway(
        secure_stack_env,
        tmp_path,
        secure_stack_env["BERGSTREAM_KAFKA_CONFIG"],
        more=secure_lake_yaml(home, trigger_seconds=5),
    )
    try:
        assert pipeline_once(secure_stack, tmp_path / "isk.yaml", topic)
        config = {
            **admin_settings(secure_stack_env).librdkafka(),
            "bootstrap.servers": secure_stack_env["BERGSTREAM_KAFKA_BOOTSTRAP"],
        }
        producer = Producer(config)
        for partition in range(PARTITIONS):
            producer.produce(topic, key=b"late", value=b"late-%d" % partition, partition=partition)
        assert producer.flush(60) == 0
        expected = expected_rows() + [
            (p, PER_PARTITION, b"late", b"late-%d" % p) for p in range(PARTITIONS)
        ]
        catalog = RestCatalog("isk", uri=gateway.catalog_url)
        deadline = time.monotonic() + 60  # ISK sees the pipeline's commit within seconds
        while catalog.load_table(f"coldset.{topic}").current_snapshot() is None:
            assert time.monotonic() < deadline, "ISK never saw the pipeline's commit"
            time.sleep(1)
        table = catalog.load_table(f"merged.{topic}")
        assert as_tuples(table.scan().to_arrow().to_pylist()) == sorted(expected)
        files = [task.file.file_path for task in table.scan().plan_files()]
        assert any("/files/" in f for f in files) and any("/data/p=" in f for f in files)

        connection = duckdb_connection()
        try:
            attach_isk(connection, gateway.catalog_url)
            got = connection.execute(f'SELECT {COLUMNS} FROM isk.merged."{topic}"').fetchall()
        finally:
            connection.close()
        assert sorted(got) == sorted(expected)

        with shared_spark() as spark:
            name = attach_spark_catalog(spark, gateway.catalog_url)
            rows = spark.sql(f"SELECT {COLUMNS} FROM {name}.merged.`{topic}`").collect()
        assert sorted(
            (r.kafka_partition, r.kafka_offset, bytes(r.kafka_key), bytes(r.kafka_value))
            for r in rows
        ) == sorted(expected)
    finally:
        stop(gateway)
