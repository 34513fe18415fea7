"""The proxy service: factories from the plugin registry, start errors, TLS toward clients."""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import replace
from typing import ClassVar

import pytest
from kio.index import load_request_schema
from pydantic import BaseModel

from bergstream.core.config import BergstreamConfig, parse_config
from bergstream.core.hookspecs import hookimpl
from bergstream.core.kafka_wire.api_keys import ApiKey
from bergstream.core.plugins import load_registry
from bergstream.core.proxy import codec
from bergstream.core.proxy.api import FilterFactory, Forward, ProxyFilter
from bergstream.core.proxy.server import (
    ProxyServer,
    ProxyStartError,
    build_filter_factories,
    build_proxy_servers,
)
from bergstream.core.registrations import FilterRegistration
from tests.kits.proxy import RawClient, cluster_config, self_signed_cert


class TagConfig(BaseModel, extra="forbid"):
    tag: str


class TagFilter(ProxyFilter):
    response_api_keys: ClassVar = frozenset({ApiKey.METADATA})

    def __init__(self, tag: str) -> None:
        self.tag = tag

    async def on_response(self, header, response, context):
        return Forward(replace(response, cluster_id=self.tag))


class TagFactory(FilterFactory[TagConfig]):
    started = 0
    closed = 0

    async def start(self) -> None:
        TagFactory.started += 1

    async def close(self) -> None:
        TagFactory.closed += 1

    def create_filter(self) -> ProxyFilter:
        return TagFilter(self.config.tag)


class Plugin:
    @hookimpl
    def register_filters(self):
        return [FilterRegistration(name="tag", factory=TagFactory, config_model=TagConfig)]


def metadata():
    return codec.build(load_request_schema(ApiKey.METADATA, 12))


async def test_factories_from_registry_run_in_the_chain(fake_broker):
    registry = load_registry([Plugin()], entry_points=False)
    port = cluster_config("x:1").gateway.port
    config = parse_config(
        f"""
virtual_clusters:
  - name: vc
    target: {{bootstrap: "{fake_broker.address}"}}
    gateway: {{port: {port}, broker_count: 1}}
    filters:
      - {{type: tag, config: {{tag: from-config}}}}
""",
        registry=registry,
    )
    factories = build_filter_factories(config.virtual_clusters[0], config, registry)
    assert isinstance(factories[0], TagFactory)
    assert factories[0].config == TagConfig(tag="from-config")
    assert factories[0].context.virtual_cluster == "vc"
    [server] = build_proxy_servers(config, registry)
    assert server.name == "proxy:vc"
    before = (TagFactory.started, TagFactory.closed)
    await server.start()
    try:
        client = await RawClient.connect(f"127.0.0.1:{port}")
        assert (await client.call(metadata())).cluster_id == "from-config"
        await client.close()
    finally:
        await server.stop()
        await server.stop()  # twice is fine
    assert (TagFactory.started, TagFactory.closed) == (before[0] + 1, before[1] + 1)


def test_factories_validate_config_when_loaded_without_registry():
    registry = load_registry([Plugin()], entry_points=False)
    config = parse_config(
        """
virtual_clusters:
  - name: vc
    target: {bootstrap: "127.0.0.1:1"}
    gateway: {port: 20000}
    filters: [{type: tag, config: {tag: t}}]
"""
    )
    [factory] = build_filter_factories(config.virtual_clusters[0], config, registry)
    assert factory.config.tag == "t"
    assert isinstance(config, BergstreamConfig)


async def test_port_in_use_is_a_clear_start_error(fake_broker):
    config = cluster_config(fake_broker.address, broker_count=2)
    blocker = await asyncio.start_server(
        lambda r, w: None, "127.0.0.1", config.gateway.broker_port(1)
    )
    try:
        server = ProxyServer(config)
        with pytest.raises(
            ProxyStartError,
            match=rf"cannot listen on 127.0.0.1:{config.gateway.broker_port(1)} \(node 1\)",
        ):
            await server.start()
        # nothing stays bound after the failed start
        again = await asyncio.start_server(lambda r, w: None, "127.0.0.1", config.gateway.port)
        again.close()
    finally:
        blocker.close()


async def test_bad_tls_file_is_a_clear_start_error(fake_broker, tmp_path):
    config = cluster_config(
        fake_broker.address,
        tls={"cert_file": str(tmp_path / "missing.crt"), "key_file": str(tmp_path / "missing.key")},
    )
    with pytest.raises(ProxyStartError, match=r"missing\.crt does not exist"):
        await ProxyServer(config).start()


async def test_tls_toward_clients(fake_broker, start_proxy, tmp_path):
    cert, key = self_signed_cert(tmp_path)
    proxy = await start_proxy(
        fake_broker.address, tls={"cert_file": str(cert), "key_file": str(key)}
    )
    context = ssl.create_default_context(cafile=str(cert))
    client = await RawClient.connect(
        f"127.0.0.1:{proxy.cluster.gateway.port}", ssl=context, server_hostname="localhost"
    )
    response = await client.call(metadata())
    assert response.brokers[0].port == proxy.cluster.gateway.broker_port(0)
    await client.close()
    # a broker port speaks TLS too
    client = await RawClient.connect(
        f"127.0.0.1:{proxy.cluster.gateway.broker_port(0)}",
        ssl=context,
        server_hostname="localhost",
    )
    assert (await client.call(metadata())).brokers
    await client.close()


async def test_mutual_tls_requires_a_client_certificate(fake_broker, start_proxy, tmp_path):
    cert, key = self_signed_cert(tmp_path, "server")
    client_cert, client_key = self_signed_cert(tmp_path, "client")
    proxy = await start_proxy(
        fake_broker.address,
        tls={"cert_file": str(cert), "key_file": str(key), "ca_file": str(client_cert)},
    )
    address = f"127.0.0.1:{proxy.cluster.gateway.port}"
    anonymous = ssl.create_default_context(cafile=str(cert))
    with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
        client = await RawClient.connect(address, ssl=anonymous, server_hostname="localhost")
        await client.call(metadata())  # TLS 1.3: the rejection arrives after the handshake
    known = ssl.create_default_context(cafile=str(cert))
    known.load_cert_chain(client_cert, client_key)
    client = await RawClient.connect(address, ssl=known, server_hostname="localhost")
    assert (await client.call(metadata())).brokers
    await client.close()


async def test_tls_toward_the_target(start_proxy, tmp_path):
    from tests.kits.proxy import FakeBroker

    cert, key = self_signed_cert(tmp_path, "broker")
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert, key)
    broker = await FakeBroker().start(ssl=server_context)
    try:
        proxy = await start_proxy(f"localhost:{broker.port}", target_tls={"ca_file": str(cert)})
        # a broker port first: the node map must be fetched from the bootstrap over TLS
        client = await RawClient.connect(f"127.0.0.1:{proxy.cluster.gateway.broker_port(0)}")
        assert (await client.call(metadata())).brokers
        await client.close()
        client = await RawClient.connect(f"127.0.0.1:{proxy.cluster.gateway.port}")
        assert (await client.call(metadata())).brokers
        await client.close()
    finally:
        await broker.stop()


async def test_untrusted_target_certificate_closes_client_with_log(start_proxy, tmp_path, caplog):
    from tests.kits.proxy import FakeBroker

    cert, key = self_signed_cert(tmp_path, "broker")
    other, _ = self_signed_cert(tmp_path, "other")
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert, key)
    broker = await FakeBroker().start(ssl=server_context)
    try:
        proxy = await start_proxy(f"localhost:{broker.port}", target_tls={"ca_file": str(other)})
        client = await RawClient.connect(f"127.0.0.1:{proxy.cluster.gateway.port}")
        assert await client.closed_by_peer()
        assert any("CERTIFICATE_VERIFY_FAILED" in r.getMessage() for r in caplog.records)
    finally:
        await broker.stop()
