"""The proxy in front of a production-like cluster: three brokers, SASL_SSL (SCRAM-SHA-512 and
PLAIN), the standard authorizer (the secured stack of ``tests/conftest.py``).

Clients speak ``SASL_PLAINTEXT`` to the proxy with the same mechanism and credentials as against
the brokers; the proxy speaks TLS to the brokers and relays the SASL exchange, so the brokers
authenticate and authorize each client themselves. Real clients: confluent-kafka, kcat and
Kafka's Java console consumer.
"""

from __future__ import annotations

import re
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient

from bergstream.devstack.stack.ports import free_port_block
from tests.support import (
    ProxyProcess,
    consume_values,
    require_binary,
    start_bergstream_run,
    wait_until,
    write_proxy_config,
)

pytestmark = pytest.mark.slow

RECORDS = 3000


def _props(path: str | Path) -> dict[str, str]:
    lines = Path(path).read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))


@pytest.fixture(scope="module")
def secure_proxy(
    secure_stack_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProxyProcess]:
    """``bergstream run`` with ``examples/proxy.yaml``'s shape: the target's security from the
    admin's properties file (the stack's ``BERGSTREAM_KAFKA_CONFIG``)."""
    port = free_port_block(5)
    config = write_proxy_config(
        tmp_path_factory.mktemp("secure-proxy") / "proxy.yaml", "secure", port
    )
    proxy = start_bergstream_run(config, f"127.0.0.1:{port}", secure_stack_env, "the secured proxy")
    try:
        yield proxy
    finally:
        proxy.stop()


def _client(proxy: ProxyProcess, env: dict[str, str], *, user: str = "admin", **extra: Any):
    """confluent-kafka settings for ``user`` through the proxy: the stack's credentials, SASL
    over plain TCP."""
    key = "BERGSTREAM_KAFKA_CONFIG" if user == "admin" else "BERGSTREAM_KAFKA_CONFIG_NOACCESS"
    props = _props(env[key])
    return {
        "bootstrap.servers": proxy.bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": props["sasl.mechanisms"],
        "sasl.username": props["sasl.username"],
        "sasl.password": props["sasl.password"],
        **extra,
    }


def _produce(config: dict[str, Any], topic: str, count: int, prefix: str = "v") -> None:
    producer = Producer({**config, "enable.idempotence": True, "linger.ms": 5})
    for i in range(count):
        producer.produce(topic, key=f"k{i % 97}".encode(), value=f"{prefix}{i}".encode())
    assert producer.flush(60) == 0


def test_sasl_clients_produce_and_consume_through_the_proxy(
    secure_proxy: ProxyProcess,
    secure_stack_env: dict[str, str],
    new_secure_topic: Callable[..., str],
) -> None:
    topic = new_secure_topic(partitions=6)
    config = _client(secure_proxy, secure_stack_env)
    metadata = AdminClient(config).list_topics(topic, timeout=30)
    leaders = {p.leader for p in metadata.topics[topic].partitions.values()}
    assert len(leaders) > 1, "the topic's leaders should spread over the brokers"
    proxy_port = int(secure_proxy.bootstrap.rsplit(":", 1)[1])
    assert {b.port for b in metadata.brokers.values()} <= set(range(proxy_port + 1, proxy_port + 5))
    assert {b.host for b in metadata.brokers.values()} == {"127.0.0.1"}
    _produce(config, topic, RECORDS)
    values = consume_values(config, topic, RECORDS)
    assert sorted(values) == sorted(f"v{i}".encode() for i in range(RECORDS))


def test_plain_mechanism_passes_through(
    secure_proxy: ProxyProcess,
    secure_stack_env: dict[str, str],
    new_secure_topic: Callable[..., str],
) -> None:
    topic = new_secure_topic(partitions=3)
    config = {**_client(secure_proxy, secure_stack_env), "sasl.mechanism": "PLAIN"}
    _produce(config, topic, 100)
    assert len(consume_values(config, topic, 100)) == 100


def test_kcat_and_the_java_console_consumer_through_the_proxy(
    secure_proxy: ProxyProcess,
    secure_stack_env: dict[str, str],
    new_secure_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    from bergstream.devstack.stack import kafka_tool_command

    kcat = require_binary("kcat")
    topic = new_secure_topic(partitions=3)
    config = _client(secure_proxy, secure_stack_env)
    _produce(config, topic, 200, prefix="kc")
    rdkafka_file = tmp_path / "proxy-client.properties"
    # Debian's kcat carries librdkafka 2.0.2, whose SCRAM proof Kafka 4 rejects (librdkafka
    # #4895, fixed in 2.6.1): it uses PLAIN, which the stack's users also have.
    kcat_config = {**config, "sasl.mechanism": "PLAIN"}
    rdkafka_file.write_text(
        "".join(f"{k}={v}\n" for k, v in kcat_config.items() if k != "bootstrap.servers")
    )
    kcat_run = subprocess.run(
        [
            kcat,
            "-F",
            str(rdkafka_file),
            "-b",
            secure_proxy.bootstrap,
            "-C",
            "-t",
            topic,
            "-o",
            "beginning",
            "-e",
            "-q",
            "-f",
            "%s\n",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert kcat_run.returncode == 0, kcat_run.stderr
    out = kcat_run.stdout.split()
    assert sorted(out) == sorted(f"kc{i}" for i in range(200))

    java_file = tmp_path / "proxy-java.properties"
    java_file.write_text(
        "security.protocol=SASL_PLAINTEXT\n"
        f"sasl.mechanism={config['sasl.mechanism']}\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{config["sasl.username"]}" password="{config["sasl.password"]}";\n'
    )
    result = subprocess.run(
        kafka_tool_command(
            "console-consumer",
            "--bootstrap-server",
            secure_proxy.bootstrap,
            "--topic",
            topic,
            "--from-beginning",
            "--max-messages",
            "200",
            "--timeout-ms",
            "60000",
            "--consumer.config",
            str(java_file),
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    # The tool also prints a notice on stdout (--consumer.config is deprecated in Kafka 4.1).
    consumed = [word for word in result.stdout.split() if word.startswith("kc")]
    assert sorted(consumed) == sorted(f"kc{i}" for i in range(200)), result.stderr


def test_refused_clients_get_kafka_errors_and_the_proxy_stays_up(
    secure_proxy: ProxyProcess,
    secure_stack_env: dict[str, str],
    new_secure_topic: Callable[..., str],
) -> None:
    topic = new_secure_topic(partitions=3)
    admin = _client(secure_proxy, secure_stack_env)
    _produce(admin, topic, 10)

    noaccess = _client(secure_proxy, secure_stack_env, user="noaccess")
    consumer = Consumer(
        {**noaccess, "group.id": f"g-{uuid.uuid4().hex[:8]}", "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topic])
    errors: list[KafkaError] = []
    deadline = time.monotonic() + 30
    while not errors and time.monotonic() < deadline:
        message = consumer.poll(1.0)
        if message is not None and message.error():
            errors.append(message.error())
        elif message is not None:
            pytest.fail("the user without rights read a record through the proxy")
    consumer.close()
    assert errors and errors[0].code() in (
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
    ), errors

    wrong = {**admin, "sasl.password": "not-the-password"}
    failures: list[str] = []
    producer = Producer({**wrong, "error_cb": lambda e: failures.append(e.str())})
    producer.produce(topic, value=b"never")
    producer.flush(10)
    assert any("Authentication failed" in f or "SASL authentication" in f for f in failures), (
        failures
    )
    # Nothing came down: the admin still gets through, on new connections.
    assert len(consume_values(admin, topic, 10)) == 10
    assert secure_proxy.process.poll() is None


def test_long_lived_connections_reauthenticate_through_the_proxy(
    secure_proxy: ProxyProcess,
    secure_stack_env: dict[str, str],
    new_secure_topic: Callable[..., str],
) -> None:
    """KIP-368: the brokers grant sessions of ``SECURE_REAUTH_MS`` (20 s); a consumer that
    stays connected for 2.5 lifetimes re-authenticates on its connections, which the broker
    would otherwise close. The proxy relays the exchange mid-stream and opens no new
    connection for it."""
    from tests.support import SECURE_REAUTH_MS

    topic = new_secure_topic(partitions=1)
    config = _client(secure_proxy, secure_stack_env)
    producer = Producer(config)
    consumer = Consumer(
        {**config, "group.id": f"g-{uuid.uuid4().hex[:8]}", "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topic])
    received: list[bytes] = []
    connected = re.compile(r"client connected \(connection (\d+)")

    def connections() -> int:
        return sum(1 for line in secure_proxy.stderr_lines if connected.search(line))

    sent = 0
    settle = time.monotonic() + 8
    baseline: int | None = None
    end = time.monotonic() + 2.5 * SECURE_REAUTH_MS / 1000
    while time.monotonic() < end:
        producer.produce(topic, value=f"r{sent}".encode())
        producer.poll(0)
        sent += 1
        message = consumer.poll(0.5)
        if message is not None:
            assert not message.error(), message.error()
            received.append(message.value())
        if baseline is None and time.monotonic() > settle:
            baseline = connections()
    assert producer.flush(30) == 0
    wait_until(lambda: _drain(consumer, received) >= sent, timeout=30)
    consumer.close()
    assert sorted(received) == sorted(f"r{i}".encode() for i in range(sent))
    assert baseline is not None and connections() == baseline, (
        "clients reconnected instead of re-authenticating"
    )


def _drain(consumer: Consumer, received: list[bytes]) -> int:
    message = consumer.poll(0.5)
    if message is not None and not message.error():
        received.append(message.value())
    return len(received)
