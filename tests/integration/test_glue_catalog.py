"""``lake.catalog.type: glue`` end to end: ``examples/glue.yaml`` as it is, with only the
environment variables a user on AWS sets (region, keys, warehouse) plus the endpoint overrides
that point it at moto's server (Glue and S3 on one port). The pipeline copies a topic into a
Glue table; ``bergstream run`` serves it as ISK's ``coldset`` and ``merged`` (with the records
produced since) and through KSI from offset 0 after Kafka deleted the first records; ``pipeline
maintain`` compacts it and every reader still sees the topic."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bergstream.devstack.stack.ports import free_port_block, free_ports
from tests.kits.ksi_stack import delete_records_below, run_pipeline_once
from tests.kits.moto_server import ACCESS_KEY, REGION, SECRET_KEY, MotoServer
from tests.kits.worker_spark import maintain_in_worker, worker_spark
from tests.support import ProxyProcess, start_bergstream_run

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "glue.yaml"
PARTITIONS = 2
COPIED = 60  # records the pipeline copies (per topic, both partitions)
DELETED_BELOW = 20  # per partition, deleted in Kafka after the copy


@dataclass
class Glue:
    env: dict[str, str]
    moto: MotoServer
    topic: str
    database: str
    bucket: str


def _values(first: int, count: int) -> list[tuple[int, bytes]]:
    return [(n % PARTITIONS, f"glue-{n}".encode()) for n in range(first, first + count)]


def _produce(bootstrap: str, topic: str, records: list[tuple[int, bytes]]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
    for partition, value in records:
        producer.produce(topic, value=value, key=value[:6], partition=partition)
    assert producer.flush(60) == 0


@pytest.fixture(scope="module")
def glue(
    moto: MotoServer,
    kafka_bootstrap: str,
    new_topic: Callable[..., str],
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch_module: pytest.MonkeyPatch,
) -> Iterator[Glue]:
    home = tmp_path_factory.mktemp("glue")
    bucket = f"glue-{uuid.uuid4().hex[:12]}"
    database = f"coldset_{uuid.uuid4().hex[:8]}"
    moto.client("s3").create_bucket(Bucket=bucket)
    catalog_port, s3_port = free_ports(2)
    ksi_port = free_port_block(5)
    env = {
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "AWS_REGION": REGION,
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "GLUE_WAREHOUSE": f"s3://{bucket}/warehouse",
        "GLUE_DATABASE": database,
        "GLUE_ENDPOINT": moto.url,
        "S3_ENDPOINT": moto.url,
        "S3_PATH_STYLE": "true",
        "BERGSTREAM_HOME": str(home / "home"),
        "BERGSTREAM_CHECKPOINT_DIR": str(home / "checkpoints"),
        "ISK_CATALOG_PORT": str(catalog_port),
        "ISK_S3_PORT": str(s3_port),
        "KSI_PORT": str(ksi_port),
    }
    for name, value in env.items():
        monkeypatch_module.setenv(name, value)
    # The test process's JVM started before these variables were set; a `pipeline run`
    # process's JVM inherits them (Iceberg's GlueCatalog reads the AWS default chain).
    from bergstream.pipeline.session import set_system_properties

    set_system_properties(
        worker_spark(), {"aws.accessKeyId": ACCESS_KEY, "aws.secretAccessKey": SECRET_KEY}
    )
    topic = new_topic(partitions=PARTITIONS)
    _produce(kafka_bootstrap, topic, _values(0, COPIED))
    yield Glue(env, moto, topic, database, bucket)


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def _glue_table(glue: Glue) -> Any:
    from pyiceberg.catalog import load_catalog

    catalog = load_catalog(
        "glue_check",
        type="glue",
        **{
            "glue.endpoint": glue.moto.url,
            "glue.region": REGION,
            "glue.access-key-id": ACCESS_KEY,
            "glue.secret-access-key": SECRET_KEY,
            "s3.endpoint": glue.moto.url,
            "s3.region": REGION,
            "s3.access-key-id": ACCESS_KEY,
            "s3.secret-access-key": SECRET_KEY,
            "s3.path-style-access": "true",
        },
    )
    return catalog.load_table((glue.database, glue.topic))


def test_the_pipeline_copies_the_topic_into_a_glue_table(glue: Glue) -> None:
    summary = run_pipeline_once(EXAMPLE, glue.topic)
    assert summary["records"] == COPIED, summary
    # Glue itself holds the table, an Iceberg table whose files are on S3.
    described = glue.moto.client("glue").get_table(DatabaseName=glue.database, Name=glue.topic)
    parameters = described["Table"]["Parameters"]
    assert parameters["table_type"].upper() == "ICEBERG"
    assert parameters["metadata_location"].startswith(f"s3://{glue.bucket}/warehouse/")
    rows = _glue_table(glue).scan().to_arrow()
    assert sorted(rows.column("kafka_value").to_pylist()) == sorted(
        v for _, v in _values(0, COPIED)
    )
    assert run_pipeline_once(EXAMPLE, glue.topic)["records"] == 0  # exactly once


@pytest.fixture(scope="module")
def running(glue: Glue) -> Iterator[ProxyProcess]:
    """``bergstream run -c examples/glue.yaml``: ISK and KSI on the Glue lake."""
    process = start_bergstream_run(
        EXAMPLE, f"127.0.0.1:{glue.env['KSI_PORT']}", glue.env, "ISK and KSI on Glue"
    )
    try:
        yield process
    finally:
        assert process.stop() == 0, process.log()


def test_isk_serves_the_glue_table_as_coldset_and_merged(glue: Glue, running: ProxyProcess) -> None:
    from pyiceberg.catalog.rest import RestCatalog

    _produce(glue.env["KAFKA_BOOTSTRAP_SERVERS"], glue.topic, _values(COPIED, 10))
    catalog = RestCatalog("isk", uri=f"http://127.0.0.1:{glue.env['ISK_CATALOG_PORT']}")
    cold = catalog.load_table(f"coldset.{glue.topic}").scan().to_arrow()
    assert cold.num_rows == COPIED
    merged = catalog.load_table(f"merged.{glue.topic}").scan().to_arrow()
    values = sorted(merged.column("kafka_value").to_pylist())
    assert values == sorted(v for _, v in _values(0, COPIED + 10)), running.log()[-3000:]


def test_ksi_serves_offsets_kafka_deleted_from_glue(glue: Glue, running: ProxyProcess) -> None:
    from confluent_kafka import Consumer, TopicPartition

    delete_records_below(glue.env["KAFKA_BOOTSTRAP_SERVERS"], glue.topic, PARTITIONS, DELETED_BELOW)
    consumer = Consumer(
        {
            "bootstrap.servers": running.bootstrap,
            "group.id": f"glue-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        consumer.assign([TopicPartition(glue.topic, p, 0) for p in range(PARTITIONS)])
        seen: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
        done: set[int] = set()
        while len(done) < PARTITIONS:
            message = consumer.poll(30)
            assert message is not None, f"no record within 30 s; seen {seen}"
            if message.error():
                assert message.error().code() == -191, message.error()  # partition EOF
                done.add(message.partition())
                continue
            seen[message.partition()].append(message.offset())
    finally:
        consumer.close()
    # every offset from 0, the deleted ones served from the Glue table
    total = sum(len(offsets) for offsets in seen.values())
    assert total >= COPIED + 10
    for offsets in seen.values():
        assert offsets == list(range(len(offsets)))


def test_maintain_compacts_the_glue_table(glue: Glue) -> None:
    before = _glue_table(glue).current_snapshot()
    report = maintain_in_worker(EXAMPLE, glue.topic)
    assert report, report
    table = _glue_table(glue)
    assert table.current_snapshot() is not None and before is not None
    assert table.scan().to_arrow().num_rows == COPIED
