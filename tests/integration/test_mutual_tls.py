"""bergstream against a mutual-TLS Kafka (``stack up --security ssl``: one client certificate per
user, the standard authorizer): the proxy, the pipeline and ISK connect with the admin's
certificate from the stack's properties file, as the examples do; clients of the proxy speak
plain Kafka to it, and the proxy's certificate is the identity the brokers authorize. A client
with the certificate of the user without rights is refused by the brokers."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from bergstream.core.api import KafkaClientSettings
from bergstream.devstack.stack.env import StackEnv
from bergstream.devstack.stack.ports import free_port_block
from tests.kits.isk_secure_gateway import start_gateway, stop
from tests.kits.ksi_stack import run_pipeline_once
from tests.support import (
    consume_values,
    secure_lake_yaml,
    start_bergstream_run,
    write_proxy_config,
)

pytestmark = pytest.mark.slow

RECORDS = 600
PARTITIONS = 3


@pytest.fixture(scope="module")
def mtls_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StackEnv]:
    """One KRaft broker with ``--security ssl`` (only Kafka), stopped by PID at the end."""
    from bergstream.devstack.stack import stack_down, stack_up

    home = tmp_path_factory.mktemp("bergstream-mtls-home")
    try:
        env = stack_up(home, {"kafka"}, security="ssl")
    except Exception:
        stack_down(home)
        raise
    try:
        yield env
    finally:
        stack_down(home)


def _direct(env: dict[str, str], user: str = "admin") -> dict[str, Any]:
    key = "BERGSTREAM_KAFKA_CONFIG" if user == "admin" else "BERGSTREAM_KAFKA_CONFIG_NOACCESS"
    settings = KafkaClientSettings.model_validate({"properties_file": env[key]})
    return {**settings.librdkafka(), "bootstrap.servers": env["BERGSTREAM_KAFKA_BOOTSTRAP"]}


@pytest.fixture(scope="module")
def topic(mtls_stack: StackEnv) -> str:
    env = mtls_stack.as_dict()
    name = f"m-{uuid.uuid4().hex[:10]}"
    admin = AdminClient(_direct(env))
    admin.create_topics([NewTopic(name, PARTITIONS, 1, config={"retention.ms": "-1"})])[
        name
    ].result(timeout=60)
    producer = Producer({**_direct(env), "enable.idempotence": True})
    for i in range(RECORDS):
        producer.produce(name, key=b"k%d" % i, value=b"v%d" % i, partition=i % PARTITIONS)
    assert producer.flush(60) == 0
    return name


def test_the_proxy_connects_with_the_admins_certificate(
    mtls_stack: StackEnv, topic: str, tmp_path: Path
) -> None:
    env = mtls_stack.as_dict()
    port = free_port_block(5)
    config = write_proxy_config(tmp_path / "proxy.yaml", "mtls", port)
    proxy = start_bergstream_run(config, f"127.0.0.1:{port}", env, "the mTLS proxy")
    try:
        values = consume_values({"bootstrap.servers": proxy.bootstrap}, topic, RECORDS)
        assert sorted(values) == sorted(b"v%d" % i for i in range(RECORDS))
    finally:
        proxy.stop()
    # The brokers refuse the certificate of the user without rights, and any client without one.
    with pytest.raises(KafkaException):
        consume_values(_direct(env, "noaccess"), topic, 1)


def test_the_pipeline_copies_over_mutual_tls(
    mtls_stack: StackEnv, topic: str, tmp_path: Path
) -> None:
    env = mtls_stack.as_dict()
    lake = tmp_path / "lake.yaml"
    lake.write_text(secure_lake_yaml(tmp_path))
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        run_pipeline_once(lake, topic)
    from bergstream.core.api import LakeConfig, load_catalog, resolve_lake

    lake_config = LakeConfig.model_validate(
        {
            "kafka_bootstrap": env["BERGSTREAM_KAFKA_BOOTSTRAP"],
            "catalog": {
                "type": "sql",
                "uri": f"sqlite:///{tmp_path}/lake/catalog.db",
                "warehouse": f"{tmp_path}/lake/warehouse",
            },
        }
    )
    catalog = load_catalog(resolve_lake(lake_config, tmp_path))
    rows = catalog.load_table(f"coldset.{topic}").scan().to_arrow().to_pylist()
    assert sorted(r["kafka_value"] for r in rows) == sorted(b"v%d" % i for i in range(RECORDS))
    assert len({(r["kafka_partition"], r["kafka_offset"]) for r in rows}) == RECORDS


def test_isk_reads_over_mutual_tls(mtls_stack: StackEnv, topic: str, tmp_path: Path) -> None:
    from pyiceberg.catalog.rest import RestCatalog

    env = mtls_stack.as_dict()
    gateway = start_gateway(env, tmp_path, env["BERGSTREAM_KAFKA_CONFIG"])
    try:
        catalog = RestCatalog("isk", uri=gateway.catalog_url)
        rows = catalog.load_table(f"hotset.{topic}").scan().to_arrow().to_pylist()
    finally:
        stop(gateway)
    assert sorted(r["kafka_value"] for r in rows) == sorted(b"v%d" % i for i in range(RECORDS))
