"""Fixtures of the proxy tests: a fake broker, proxies in-process, and real Kafka (slow)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from bergstream.core.proxy.server import ProxyServer
from tests.kits.proxy import FakeBroker, FuzzTarget, cluster_config


@pytest.fixture
async def fake_broker() -> AsyncIterator[FakeBroker]:
    """A kio-speaking fake broker on a free port."""
    broker = await FakeBroker().start()
    yield broker
    await broker.stop()


StartProxy = Callable[..., Awaitable[ProxyServer]]


@pytest.fixture
async def start_proxy() -> AsyncIterator[StartProxy]:
    """Start an in-process :class:`ProxyServer` in front of a bootstrap; stopped after the test.

    ``await start_proxy(bootstrap, factories, **cluster_config_kwargs)``.
    """
    servers: list[ProxyServer] = []

    async def start(bootstrap: str, factories: Any = (), **kwargs: Any) -> ProxyServer:
        server = ProxyServer(cluster_config(bootstrap, **kwargs), list(factories))
        await server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.stop()


@pytest.fixture
async def kafka_fuzz_proxy(kafka_bootstrap: str) -> AsyncIterator[FuzzTarget]:
    """A proxy of the test's own in front of real Kafka, recording internal errors logged
    meanwhile."""
    async with FuzzTarget.running(kafka_bootstrap) as target:
        yield target


@pytest.fixture
async def fake_fuzz_proxy() -> AsyncIterator[FuzzTarget]:
    """Like ``kafka_fuzz_proxy`` in front of a fake broker."""
    broker = await FakeBroker().start()
    async with FuzzTarget.running(broker.address) as target:
        yield target
    await broker.stop()
