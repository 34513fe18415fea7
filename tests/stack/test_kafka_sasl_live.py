"""KafkaClientSettings and the SASL client against real secured brokers (``stack up --security
sasl_ssl`` and ``ssl``, one broker each, one stack per class so only one runs at a time).

The sasl_ssl broker also gets ``connections.max.reauth.ms`` (the stack does not set it) so the
session lifetime and re-authentication of KIP-368 can be seen live.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bergstream.core.kafka_client import KafkaClientSettings
from bergstream.core.kafka_sasl import (
    KafkaAuthenticationError,
    KafkaConnection,
    kafka_request,
    open_kafka_connection,
    sasl_reauthenticate,
)
from bergstream.core.kafka_wire.api_keys import ApiKey
from bergstream.core.proxy.codec import build_request
from bergstream.devstack.stack import kafka_security, kafka_tool_command, stack_down, stack_up
from bergstream.devstack.stack.env import StackEnv

pytestmark = pytest.mark.slow

REAUTH_MS = 20_000
SCRAM_FAILED = (
    "Authentication failed during authentication due to invalid credentials with SASL "
    "mechanism SCRAM-SHA-512"
)
PLAIN_FAILED = "Authentication failed: Invalid username or password"


def _start(home: Path, security: str) -> StackEnv:
    with pytest.MonkeyPatch.context() as patch:
        if security == "sasl_ssl":
            original = kafka_security.server_security_properties

            def with_reauth(
                files: kafka_security.SecurityFiles, mode: str, **logins: Any
            ) -> dict[str, str]:
                return {
                    **original(files, mode, **logins),
                    "connections.max.reauth.ms": str(REAUTH_MS),
                }

            patch.setattr(kafka_security, "server_security_properties", with_reauth)
        t0 = time.monotonic()
        try:
            env = stack_up(home, {"kafka"}, security=security)
        except Exception:
            stack_down(home)
            raise
        print(f"\n{security} stack up: {time.monotonic() - t0:.1f} s")
        return env


def _address(env: StackEnv) -> tuple[str, int]:
    assert env.kafka_bootstrap is not None
    host, port = env.kafka_bootstrap.split(",")[0].rsplit(":", 1)
    return host, int(port)


async def _api_versions(conn: KafkaConnection, correlation_id: int = 1) -> Any:
    return await kafka_request(
        conn.reader,
        conn.writer,
        build_request(
            ApiKey.API_VERSIONS,
            3,
            client_software_name="bergstream-test",
            client_software_version="1.0",
        ),
        correlation_id=correlation_id,
        client_id="live",
    )


async def _metadata(conn: KafkaConnection) -> Any:
    return await kafka_request(
        conn.reader,
        conn.writer,
        build_request(ApiKey.METADATA, 12, topics=None),
        correlation_id=2,
        client_id="live",
    )


def _produce_consume(conf: dict[str, Any], topic: str, count: int = 5) -> list[bytes]:
    from confluent_kafka import Consumer, Producer

    failed: list[Any] = []
    producer = Producer({**conf, "acks": "all"})
    for i in range(count):
        producer.produce(
            topic,
            value=f"v{i}".encode(),
            on_delivery=lambda err, _msg: failed.append(err) if err else None,
        )
    assert producer.flush(60) == 0 and failed == []
    consumer = Consumer(
        {**conf, "group.id": f"g-{uuid.uuid4().hex[:8]}", "auto.offset.reset": "earliest"}
    )
    values: list[bytes] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 60
        while len(values) < count and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is not None:
                assert msg.error() is None, msg.error()
                values.append(msg.value())
    finally:
        consumer.close()
    return values


async def _aiokafka_round_trip(bootstrap: str, settings: KafkaClientSettings) -> list[bytes]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    topic = f"aio-{uuid.uuid4().hex[:8]}"
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, **settings.aiokafka())
    await producer.start()
    try:
        for i in range(3):
            await producer.send_and_wait(topic, f"a{i}".encode())
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", **settings.aiokafka()
    )
    await consumer.start()
    values: list[bytes] = []
    try:
        async with asyncio.timeout(60):
            while len(values) < 3:
                batches = await consumer.getmany(timeout_ms=1000)
                values += [record.value for records in batches.values() for record in records]
    finally:
        await consumer.stop()
    return values


def _kafka_topics_list(env: StackEnv, settings: KafkaClientSettings, tmp: Path) -> Any:
    config = tmp / "java.properties"
    fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(settings.java_properties_text())
    command = kafka_tool_command(
        "topics",
        "--bootstrap-server",
        env.kafka_bootstrap or "",
        "--command-config",
        str(config),
        "--list",
    )
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


# ---------------------------------------------------------------------------------------------
# SASL_SSL


@pytest.fixture(scope="class")
def sasl_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StackEnv]:
    home = tmp_path_factory.mktemp("sasl-live") / "home"
    env = _start(home, "sasl_ssl")
    try:
        yield env
    finally:
        stack_down(home)


def _sasl_settings(env: StackEnv, **extra: str) -> KafkaClientSettings:
    return KafkaClientSettings.from_env({**env.as_dict(), **extra})


class TestSaslSsl:
    @pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "PLAIN"])
    async def test_open_authenticate_request_reauthenticate(
        self, sasl_stack: StackEnv, mechanism: str
    ) -> None:
        settings = _sasl_settings(sasl_stack, BERGSTREAM_KAFKA_SASL_MECHANISM=mechanism)
        host, port = _address(sasl_stack)
        conn = await open_kafka_connection(host, port, settings, client_id="live", timeout=30)
        try:
            assert conn.session is not None
            assert (conn.session.mechanism, conn.session.username) == (mechanism, "admin")
            # The broker grants at most connections.max.reauth.ms.
            assert 0 < conn.session.session_lifetime_ms <= REAUTH_MS
            versions = await _api_versions(conn)
            assert versions.error_code == 0
            assert ApiKey.FETCH in {key.api_key for key in versions.api_keys}
            metadata = await _metadata(conn)
            assert [(b.host, b.port) for b in metadata.brokers] == [(host, port)]
            again = await sasl_reauthenticate(conn.reader, conn.writer, settings, client_id="live")
            assert again.authenticated_at > conn.session.authenticated_at
            assert 0 < again.session_lifetime_ms <= REAUTH_MS
            assert (await _api_versions(conn, 3)).error_code == 0
        finally:
            await conn.close()

    @pytest.mark.parametrize(
        ("mechanism", "said"), [("SCRAM-SHA-512", SCRAM_FAILED), ("PLAIN", PLAIN_FAILED)]
    )
    async def test_a_wrong_password_is_refused_with_the_brokers_words(
        self, sasl_stack: StackEnv, mechanism: str, said: str
    ) -> None:
        settings = _sasl_settings(
            sasl_stack,
            BERGSTREAM_KAFKA_SASL_MECHANISM=mechanism,
            BERGSTREAM_KAFKA_SASL_PASSWORD="not-the-password",
        )
        with pytest.raises(KafkaAuthenticationError) as caught:
            await open_kafka_connection(*_address(sasl_stack), settings, timeout=30)
        assert caught.value.error_code == 58  # SASL_AUTHENTICATION_FAILED
        assert caught.value.broker_message == said
        assert f"refused the credentials of 'admin' ({mechanism}): {said}" in str(caught.value)
        assert "not-the-password" not in str(caught.value)

    async def test_a_mechanism_not_enabled_and_a_missing_tls_are_named(
        self, sasl_stack: StackEnv
    ) -> None:
        address = _address(sasl_stack)
        settings = _sasl_settings(sasl_stack, BERGSTREAM_KAFKA_SASL_MECHANISM="SCRAM-SHA-256")
        with pytest.raises(KafkaAuthenticationError, match=r"it enables SCRAM-SHA-512, PLAIN"):
            await open_kafka_connection(*address, settings, timeout=30)
        no_tls = _sasl_settings(
            sasl_stack,
            BERGSTREAM_KAFKA_SECURITY_PROTOCOL="SASL_PLAINTEXT",
            BERGSTREAM_KAFKA_SSL_CA_LOCATION="",
        )
        with pytest.raises(KafkaAuthenticationError, match="this listener speaks TLS"):
            await open_kafka_connection(*address, no_tls, timeout=30)

    def test_confluent_kafka_with_librdkafka(self, sasl_stack: StackEnv) -> None:
        settings = _sasl_settings(sasl_stack)
        conf = {**settings.librdkafka(), "bootstrap.servers": sasl_stack.kafka_bootstrap}
        values = _produce_consume(conf, f"ck-{uuid.uuid4().hex[:8]}")
        assert sorted(values) == [f"v{i}".encode() for i in range(5)]
        # The stack's properties file alone, bootstrap included (PLAIN: the same admin user).
        from_file = KafkaClientSettings.model_validate(
            {
                "properties_file": sasl_stack.as_dict()["BERGSTREAM_KAFKA_CONFIG"],
                "sasl.mechanism": "PLAIN",
            }
        )
        assert from_file.bootstrap == sasl_stack.kafka_bootstrap
        assert len(_produce_consume(from_file.librdkafka(), f"ck-{uuid.uuid4().hex[:8]}")) == 5

    async def test_aiokafka_with_aiokafka(self, sasl_stack: StackEnv) -> None:
        assert sasl_stack.kafka_bootstrap is not None
        values = await _aiokafka_round_trip(sasl_stack.kafka_bootstrap, _sasl_settings(sasl_stack))
        assert values == [b"a0", b"a1", b"a2"]

    def test_kafka_tools_with_java(self, sasl_stack: StackEnv, tmp_path: Path) -> None:
        out = _kafka_topics_list(sasl_stack, _sasl_settings(sasl_stack), tmp_path)
        assert out.returncode == 0, out.stderr
        wrong = _sasl_settings(sasl_stack, BERGSTREAM_KAFKA_SASL_PASSWORD="nope")
        out = _kafka_topics_list(sasl_stack, wrong, tmp_path)
        assert out.returncode != 0 and "SaslAuthenticationException" in out.stderr


# ---------------------------------------------------------------------------------------------
# SSL (mutual TLS)


@pytest.fixture(scope="class")
def ssl_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StackEnv]:
    home = tmp_path_factory.mktemp("ssl-live") / "home"
    env = _start(home, "ssl")
    try:
        yield env
    finally:
        stack_down(home)


class TestMutualTls:
    async def test_open_with_certificate_and_key(self, ssl_stack: StackEnv) -> None:
        settings = KafkaClientSettings.from_env(ssl_stack.as_dict())
        assert settings.ssl_certificate_location is not None
        conn = await open_kafka_connection(*_address(ssl_stack), settings, timeout=30)
        try:
            assert conn.session is None
            assert (await _api_versions(conn)).error_code == 0
            assert len((await _metadata(conn)).brokers) == 1
        finally:
            await conn.close()

    async def test_without_a_certificate_the_broker_refuses(self, ssl_stack: StackEnv) -> None:
        exported = ssl_stack.as_dict()
        settings = KafkaClientSettings.from_env(
            {
                **exported,
                "BERGSTREAM_KAFKA_SSL_CERTIFICATE_LOCATION": "",
                "BERGSTREAM_KAFKA_SSL_KEY_LOCATION": "",
            }
        )
        with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError, OSError)):
            # TLS 1.3 reports the missing certificate after the handshake, at the first read.
            conn = await open_kafka_connection(*_address(ssl_stack), settings, timeout=30)
            try:
                await _api_versions(conn)
            finally:
                await conn.close()

    def test_confluent_kafka_and_aiokafka(self, ssl_stack: StackEnv) -> None:
        settings = KafkaClientSettings.from_env(ssl_stack.as_dict())
        conf = {**settings.librdkafka(), "bootstrap.servers": ssl_stack.kafka_bootstrap}
        assert len(_produce_consume(conf, f"mtls-{uuid.uuid4().hex[:8]}")) == 5
        assert ssl_stack.kafka_bootstrap is not None
        values = asyncio.run(_aiokafka_round_trip(ssl_stack.kafka_bootstrap, settings))
        assert values == [b"a0", b"a1", b"a2"]

    def test_kafka_tools_with_the_inline_pem_key_store(
        self, ssl_stack: StackEnv, tmp_path: Path
    ) -> None:
        settings = KafkaClientSettings.from_env(ssl_stack.as_dict())
        assert "ssl.keystore.key" in settings.java()
        out = _kafka_topics_list(ssl_stack, settings, tmp_path)
        assert out.returncode == 0, out.stderr
