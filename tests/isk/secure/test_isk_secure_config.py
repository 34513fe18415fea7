"""The ``isk`` service's ``kafka_client`` and ``http.tls`` settings: parsing, errors that name
the fix, secrets kept out of output, ISK's Fetch connections over TLS and its listeners over
HTTPS (a local TLS server stands in for a broker; the secured Kafka is in
tests/isk/secure/test_isk_secure.py)."""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import struct
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from bergstream.core.api import KafkaClientSettings
from bergstream.plugins.isk_gateway.http.server import IskHttpConfig, IskHttpService
from bergstream.plugins.isk_gateway.kafka.raw_fetch import (
    FetchAuthenticationError,
    FetchConnections,
)
from bergstream.plugins.isk_gateway.service import IskServiceConfig, _built_in_synthesizer
from bergstream.plugins.isk_gateway.settings import HotsetDataSynthesizerConfig
from tests.kits.certs import ServerCertificate, write_server_certificate
from tests.kits.isk_http_fakes import FakeProvider
from tests.support import BERGSTREAM

PASSWORD = "s3cr3t-pa55word"
HTTP = {"access_key": "a", "secret_key": "b"}


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> ServerCertificate:
    return write_server_certificate(tmp_path_factory.mktemp("certs"))


def properties(tmp_path: Path, ca: Path, password: str | None = PASSWORD) -> Path:
    lines = [
        "bootstrap.servers=127.0.0.1:1",
        "security.protocol=SASL_SSL",
        "sasl.mechanisms=SCRAM-SHA-512",
        "sasl.username=admin",
        f"ssl.ca.location={ca}",
    ]
    if password is not None:
        lines.append(f"sasl.password={password}")
    path = tmp_path / "client.properties"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_kafka_client_defaults_to_plaintext() -> None:
    config = IskServiceConfig.model_validate({"kafka_bootstrap": "127.0.0.1:1", "http": HTTP})
    assert config.kafka_client.security_protocol == "PLAINTEXT"
    assert config.http.tls is None


def test_kafka_client_from_a_properties_file_reaches_the_built_in_synthesizer(
    tmp_path: Path, certs: ServerCertificate
) -> None:
    config = IskServiceConfig.model_validate(
        {
            "kafka_bootstrap": "127.0.0.1:1",
            "kafka_client": {"properties_file": str(properties(tmp_path, certs.ca_file))},
            "http": HTTP,
        }
    )
    client = config.kafka_client
    assert (client.security_protocol, client.sasl_mechanism) == ("SASL_SSL", "SCRAM-SHA-512")
    assert client.aiokafka()["sasl_plain_password"] == PASSWORD
    assert PASSWORD not in repr(config) and PASSWORD not in str(config)
    files = HotsetDataSynthesizerConfig.model_validate(_built_in_synthesizer(config).config)
    assert files.kafka_client.librdkafka() == client.librdkafka()


def test_empty_values_mean_plaintext() -> None:
    config = IskServiceConfig.model_validate(
        {"kafka_bootstrap": "127.0.0.1:1", "kafka_client": {"properties_file": ""}, "http": HTTP}
    )
    assert config.kafka_client.security_protocol == "PLAINTEXT"


def check(tmp_path: Path, service: str = "", http: str = "") -> subprocess.CompletedProcess[str]:
    """``bergstream config check`` of an isk service with ``service`` lines added to its
    config and ``http`` lines to its ``http`` block."""
    config = tmp_path / "isk.yaml"
    config.write_text(
        "services:\n  - type: isk\n    config:\n      kafka_bootstrap: 127.0.0.1:1\n"
        "      http:\n        access_key: a\n        secret_key: b\n" + http + service
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("BERGSTREAM_")}
    return subprocess.run(
        [BERGSTREAM, "config", "check", str(config)],
        capture_output=True,
        text=True,
        env={**env, "BERGSTREAM_HOME": str(tmp_path / "home")},
        timeout=60,
    )


def test_config_check_accepts_a_secured_client_without_showing_its_password(
    tmp_path: Path, certs: ServerCertificate
) -> None:
    path = properties(tmp_path, certs.ca_file)
    result = check(tmp_path, f"      kafka_client: {{properties_file: '{path}'}}\n")
    assert result.returncode == 0, result.stderr
    assert PASSWORD not in result.stdout + result.stderr


def test_config_check_names_a_missing_password(tmp_path: Path, certs: ServerCertificate) -> None:
    path = properties(tmp_path, certs.ca_file, password=None)
    result = check(tmp_path, f"      kafka_client: {{properties_file: '{path}'}}\n")
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "kafka_client" in output and "sasl.password" in output


def test_config_check_hides_a_password_in_an_invalid_block(tmp_path: Path) -> None:
    block = (
        "      kafka_client:\n        security.protocol: PLAINTEXT\n"
        f"        sasl.password: {PASSWORD}\n"
    )
    result = check(tmp_path, block)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "security.protocol is PLAINTEXT" in output and PASSWORD not in output


def test_config_check_names_a_missing_certificate_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.pem"
    tls = f"        tls: {{cert_file: '{missing}', key_file: '{missing}'}}\n"
    result = check(tmp_path, http=tls)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "http.tls.cert_file" in output and "does not exist" in output


def test_config_check_accepts_https(tmp_path: Path, certs: ServerCertificate) -> None:
    tls = f"        tls: {{cert_file: '{certs.cert_file}', key_file: '{certs.key_file}'}}\n"
    result = check(tmp_path, http=tls)
    assert result.returncode == 0, result.stderr


def test_tls_with_a_key_of_another_certificate_is_refused(
    tmp_path: Path, certs: ServerCertificate
) -> None:
    other = write_server_certificate(tmp_path, "other")
    with pytest.raises(ValidationError, match="cannot use the certificate"):
        IskHttpConfig(**HTTP, tls={"cert_file": certs.cert_file, "key_file": other.key_file})


# ------------------------------------------------------------------ Fetch connections over TLS


def fetch_frame(correlation_id: int, records: bytes) -> bytes:
    """A Fetch v4 response for topic "t" partition 0, no aborted transactions."""
    body = struct.pack(">iiih1s", correlation_id, 0, 1, 1, b"t")
    body += struct.pack(">iihqqi", 1, 0, 0, 10, 10, 0)
    body += struct.pack(">i", len(records)) + records
    return struct.pack(">i", len(body)) + body


async def tls_broker(certs: ServerCertificate) -> asyncio.Server:
    """A TLS listener answering every Fetch with the records ``records!``."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                (length,) = struct.unpack(">i", await reader.readexactly(4))
                request = await reader.readexactly(length)
                (correlation_id,) = struct.unpack_from(">i", request, 4)
                writer.write(fetch_frame(correlation_id, b"records!"))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certs.cert_file, certs.key_file)
    return await asyncio.start_server(handle, "127.0.0.1", 0, ssl=context)


async def test_fetch_connections_speak_tls_and_are_reused(certs: ServerCertificate) -> None:
    server = await tls_broker(certs)
    address = server.sockets[0].getsockname()[:2]
    settings = KafkaClientSettings.model_validate(
        {"security.protocol": "SSL", "ssl.ca.location": str(certs.ca_file)}
    )
    connections = FetchConnections("test", timeout_seconds=5, settings=settings)
    try:
        into = np.zeros(16, dtype=np.uint8)
        first = await connections.fetch(address, "t", 0, 0, 100, into)
        assert bytes(first.records) == b"records!" and bytes(into[:8]) == b"records!"
        pooled = connections._idle[address][0]
        second = await connections.fetch(address, "t", 0, 0, 100)
        assert bytes(second.records) == b"records!"
        assert connections._idle[address] == [pooled]  # the same connection, reused
    finally:
        connections.close()
        server.close()
        await server.wait_closed()


async def test_an_untrusted_broker_certificate_is_an_authentication_error(
    tmp_path: Path, certs: ServerCertificate
) -> None:
    server = await tls_broker(certs)
    address = server.sockets[0].getsockname()[:2]
    stranger = write_server_certificate(tmp_path, "stranger")
    settings = KafkaClientSettings.model_validate(
        {"security.protocol": "SSL", "ssl.ca.location": str(stranger.ca_file)}
    )
    connections = FetchConnections("test", timeout_seconds=5, settings=settings)
    try:
        with pytest.raises(FetchAuthenticationError, match=r"not trusted.*ssl\.ca\.location"):
            await connections.fetch(address, "t", 0, 0, 100)
    finally:
        server.close()
        await server.wait_closed()


# ------------------------------------------------------------------------- HTTPS listeners


async def test_https_listeners_vend_an_https_endpoint(certs: ServerCertificate) -> None:
    config = IskHttpConfig(
        **HTTP,
        catalog_port=0,
        s3_port=0,
        tls={"cert_file": certs.cert_file, "key_file": certs.key_file},
    )
    service = IskHttpService(config, FakeProvider())
    await service.start()
    try:
        assert service.catalog_url and service.catalog_url.startswith("https://127.0.0.1:")
        assert service.s3_url and service.s3_url.startswith("https://127.0.0.1:")
        trusted = ssl.create_default_context(cafile=str(certs.ca_file))
        url = f"{service.catalog_url}/v1/namespaces/hotset/tables/orders"

        def load(context: ssl.SSLContext) -> Any:
            with urllib.request.urlopen(url, timeout=10, context=context) as response:
                return json.load(response)

        body = await asyncio.to_thread(load, trusted)
        assert body["config"]["s3.endpoint"] == service.s3_url
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            await asyncio.to_thread(load, ssl.create_default_context())
        plain = url.replace("https://", "http://")
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            await asyncio.to_thread(urllib.request.urlopen, plain, None, 10)
    finally:
        await service.stop()
