"""The proxy (``bergstream run``) in front of the stack's Kafka under 1,000 concurrent client
connections on loopback: every connection gets valid ApiVersions and Metadata answers while all
are open, the proxy still serves after they close, and its memory per connection is reported."""

from __future__ import annotations

import asyncio
import json
import resource
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from kio.schema.api_versions.v3 import ApiVersionsRequest
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v4 import MetadataRequest

from bergstream.core.api import kafka_request
from tests.support import ProxyProcess

pytestmark = pytest.mark.slow

CONNECTIONS = 1000
#: Connections opened at once (the listen backlog is finite; all stay open once opened).
OPENING = 100
#: File descriptors the proxy needs: two per client connection (the client's and its broker
#: connection) plus its own (listeners, logs, Python, Kafka metadata connections).
FDS_NEEDED = 2 * CONNECTIONS + 200
#: Resident memory one idle client connection (and its broker connection) may cost the proxy:
#: two sockets with asyncio transports and protocols, a filter chain and buffers: about 14 KB
#: measured; 256 KB per connection would mean per-connection buffers far larger than any frame.
BYTES_PER_CONNECTION_BOUND = 256 * 1024


def fd_limit(pid: int) -> int:
    """The soft open-files limit of process ``pid``."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError(f"no open-files limit in /proc/{pid}/limits")


def rss(pid: int) -> int:
    """Resident memory of process ``pid`` in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


async def exchange(
    connection: tuple[asyncio.StreamReader, asyncio.StreamWriter], number: int
) -> tuple[int, int]:
    """ApiVersions then Metadata on one open connection; (API keys listed, brokers listed)."""
    reader, writer = connection
    versions = await kafka_request(
        reader,
        writer,
        ApiVersionsRequest(client_software_name="load", client_software_version="1"),
        correlation_id=2 * number,
        client_id=f"load-{number}",
    )
    assert versions.error_code == ErrorCode.none, versions.error_code
    metadata = await kafka_request(
        reader,
        writer,
        MetadataRequest(topics=None, allow_auto_topic_creation=False),
        correlation_id=2 * number + 1,
        client_id=f"load-{number}",
    )
    return len(versions.api_keys), len(metadata.brokers)


async def many_connections(host: str, port: int, pid: int) -> dict[str, float]:
    """Open ``CONNECTIONS`` connections, exchange on each with all open, measure, close."""
    opening = asyncio.Semaphore(OPENING)

    async def open_one() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        async with opening:
            return await asyncio.wait_for(asyncio.open_connection(host, port), 30)

    before = rss(pid)
    began = time.monotonic()
    connections = await asyncio.gather(*(open_one() for _ in range(CONNECTIONS)))
    opened_s = time.monotonic() - began
    try:
        answers = await asyncio.wait_for(
            asyncio.gather(*(exchange(c, n) for n, c in enumerate(connections))), 120
        )
        exchanged_s = time.monotonic() - began - opened_s
        await asyncio.sleep(1)  # let the proxy settle (buffers, its own metadata refresh)
        during = rss(pid)
        # Every connection is still usable after all of them were served once.
        again = await asyncio.wait_for(
            asyncio.gather(*(exchange(c, n + CONNECTIONS) for n, c in enumerate(connections))),
            120,
        )
    finally:
        for _, writer in connections:
            writer.close()
        await asyncio.gather(*(w.wait_closed() for _, w in connections), return_exceptions=True)
    assert len(answers) == len(again) == CONNECTIONS
    assert all(keys > 10 and brokers >= 1 for keys, brokers in [*answers, *again]), answers[:3]
    return {
        "connections": CONNECTIONS,
        "open_s": round(opened_s, 2),
        "exchange_s": round(exchanged_s, 2),
        "rss_before_mb": round(before / 2**20, 1),
        "rss_open_mb": round(during / 2**20, 1),
        "bytes_per_connection": round((during - before) / CONNECTIONS),
    }


def test_thousand_concurrent_connections(run_proxy: Callable[..., ProxyProcess]) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < CONNECTIONS + 200:
        wanted = CONNECTIONS + 200 if hard == resource.RLIM_INFINITY else min(hard, 65536)
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))  # the proxy inherits it
    proxy = run_proxy()
    pid = proxy.process.pid
    limit = fd_limit(pid)
    assert limit >= FDS_NEEDED, f"the proxy may open {limit} files, it needs {FDS_NEEDED}"
    host, port = proxy.bootstrap.rsplit(":", 1)

    async def warm_up() -> None:  # the proxy's own metadata connection and imports
        connection = await asyncio.open_connection(host, int(port))
        try:
            await exchange(connection, 0)
        finally:
            connection[1].close()

    asyncio.run(warm_up())
    figures = asyncio.run(many_connections(host, int(port), pid))
    asyncio.run(warm_up())  # still serving after 1,000 connections came and went
    figures["rss_after_close_mb"] = round(rss(pid) / 2**20, 1)
    print(json.dumps(figures))
    assert proxy.process.poll() is None, proxy.log()[-3000:]
    assert figures["bytes_per_connection"] < BYTES_PER_CONNECTION_BOUND, figures
    assert "Traceback" not in proxy.log() and " ERROR " not in proxy.log(), proxy.log()[-3000:]
