"""Test helpers for the proxy: a tiny kio-speaking fake broker and a raw Kafka client.

The fake broker is enough to test the connection mechanics (ordering, correlation ids,
filters, out-of-band requests, malformed frames) in milliseconds, without a JVM.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kio.index import load_response_schema
from kio.static.protocol import RequestHeader, RequestPayload, ResponsePayload

from bergstream.core.config import BergstreamConfig, VirtualClusterConfig
from bergstream.core.kafka_wire.api_keys import ApiKey
from bergstream.core.proxy import codec
from bergstream.core.proxy.api import FilterFactory, FilterFactoryContext, ProxyFilter
from bergstream.core.proxy.versions import KIO_VERSIONS
from bergstream.core.registrations import EmptyConfig
from bergstream.devstack.stack.ports import free_port_block

Handler = Callable[[RequestHeader, Any], Awaitable[ResponsePayload | None] | ResponsePayload | None]


def cluster_config(
    bootstrap: str,
    *,
    broker_count: int = 3,
    lowest_broker_id: int = 0,
    name: str = "vc",
    max_frame_bytes: int = 1024 * 1024,
    tls: dict[str, Any] | None = None,
    advertised_host: str | None = None,
    target_tls: dict[str, Any] | None = None,
    kafka_client: dict[str, Any] | None = None,
) -> VirtualClusterConfig:
    """A virtual cluster config on free local ports in front of ``bootstrap``."""
    port = free_port_block(broker_count + 1)
    gateway: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": port,
        "broker_count": broker_count,
        "lowest_broker_id": lowest_broker_id,
    }
    if tls is not None:
        gateway["tls"] = tls
    if advertised_host is not None:
        gateway["advertised_host"] = advertised_host
    return VirtualClusterConfig.model_validate(
        {
            "name": name,
            "target": {
                "bootstrap": bootstrap,
                "tls": target_tls,
                "kafka_client": kafka_client or {},
            },
            "gateway": gateway,
            "max_frame_bytes": max_frame_bytes,
            "upstream_timeout_seconds": 5,
        }
    )


def response_for(api_key: int, api_version: int, **values: Any) -> Any:
    """Build a kio response of the given API version, zero-filled."""
    return codec.build(load_response_schema(api_key, api_version), **values)


@dataclass
class FakeBroker:
    """A broker that decodes every request with kio and answers with ``handlers``.

    Default answers: ApiVersions (every version kio has, plus an unknown API key 999 and a
    Produce range wider than kio's), Metadata (this broker as node ``node_id``), Produce (no
    errors). ``seen`` records ``(header, request)`` of every request.
    """

    node_id: int = 0
    handlers: dict[int, Handler] = field(default_factory=dict)
    extra_nodes: dict[int, tuple[str, int]] = field(default_factory=dict)
    seen: list[tuple[RequestHeader, Any]] = field(default_factory=list)
    port: int = 0
    server: asyncio.Server | None = None
    writers: list[asyncio.StreamWriter] = field(default_factory=list)

    @property
    def address(self) -> str:
        """``127.0.0.1:port``."""
        return f"127.0.0.1:{self.port}"

    async def start(self, ssl: Any = None) -> FakeBroker:
        """Listen on a free port (with TLS if an ``ssl`` server context is given)."""
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=ssl)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        """Close the listener and every connection."""
        assert self.server is not None
        self.server.close()
        for writer in self.writers:
            writer.close()
        await self.server.wait_closed()

    def default_response(self, header: RequestHeader, request: Any) -> Any:
        """The built-in answer for ApiVersions, Metadata and Produce."""
        key, version = header.request_api_key, header.request_api_version
        if key == ApiKey.API_VERSIONS:
            entry_type = codec.field_entity_type(
                load_response_schema(ApiKey.API_VERSIONS, version), "api_keys"
            )
            entries = [
                codec.build(entry_type, api_key=k, min_version=low, max_version=high)
                for k, (low, high) in sorted(KIO_VERSIONS.items())
            ]
            entries.append(codec.build(entry_type, api_key=999, min_version=0, max_version=3))
            entries[0] = codec.build(
                entry_type, api_key=ApiKey.PRODUCE, min_version=0, max_version=99
            )
            return response_for(ApiKey.API_VERSIONS, version, api_keys=tuple(entries))
        if key == ApiKey.METADATA:
            broker_type = codec.field_entity_type(
                load_response_schema(ApiKey.METADATA, version), "brokers"
            )
            nodes = {self.node_id: ("127.0.0.1", self.port), **self.extra_nodes}
            brokers = tuple(
                codec.build(broker_type, node_id=node, host=host, port=port)
                for node, (host, port) in sorted(nodes.items())
            )
            return response_for(
                ApiKey.METADATA, version, brokers=brokers, controller_id=self.node_id
            )
        if key == ApiKey.PRODUCE:
            from bergstream.core.proxy.errors import build_error_response

            return build_error_response(header, request, 0)
        raise NotImplementedError(f"fake broker has no answer for api {key}")

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        try:
            while True:
                (length,) = struct.unpack(">i", await reader.readexactly(4))
                if not 0 <= length <= 100 * 1024 * 1024:
                    return
                message = await reader.readexactly(length)
                try:
                    header, request = codec.decode_request(message)
                except codec.CodecError:
                    return  # like Kafka: close on a request it cannot parse
                self.seen.append((header, request))
                handler = self.handlers.get(header.request_api_key)
                if handler is None:
                    response = self.default_response(header, request)
                else:
                    response = handler(header, request)
                    if asyncio.iscoroutine(response):
                        response = await response
                if header.request_api_key == ApiKey.PRODUCE and request.acks == 0:
                    continue
                if response is None:
                    continue
                if isinstance(response, bytes):
                    writer.write(response)
                else:
                    writer.write(codec.encode_response(header.correlation_id, response))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, NotImplementedError):
            pass  # like a broker: close the connection
        finally:
            writer.close()


class RawClient:
    """A minimal Kafka client on a plain socket: send kio requests, read kio responses."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.sent: dict[int, tuple[int, int]] = {}

    @classmethod
    async def connect(cls, address: str, **kwargs: Any) -> RawClient:
        """Open a connection to ``host:port``."""
        host, _, port = address.rpartition(":")
        reader, writer = await asyncio.open_connection(host, int(port), **kwargs)
        return cls(reader, writer)

    def send(self, request: RequestPayload, correlation_id: int, client_id: str = "raw") -> None:
        """Queue one request (no waiting)."""
        key, version = request.__api_key__, request.__version__
        header = codec.make_request_header(key, version, correlation_id, client_id)
        self.sent[correlation_id] = (key, version)
        self.writer.write(codec.encode_request(header, request))

    def send_raw(self, data: bytes) -> None:
        """Write raw bytes."""
        self.writer.write(data)

    async def receive(self, timeout: float = 5.0) -> tuple[int, Any]:
        """Read the next response; decode it by the correlation id it carries."""
        (length,) = struct.unpack(">i", await asyncio.wait_for(self.reader.readexactly(4), timeout))
        message = await asyncio.wait_for(self.reader.readexactly(length), timeout)
        (correlation_id,) = struct.unpack_from(">i", message)
        key, version = self.sent[correlation_id]
        return codec.decode_response(key, version, message)

    async def call(self, request: RequestPayload, correlation_id: int = 1) -> Any:
        """Send one request and return its decoded response."""
        self.send(request, correlation_id)
        received, response = await self.receive()
        assert received == correlation_id
        return response

    async def closed_by_peer(self, timeout: float = 5.0) -> bool:
        """True if the peer closes the connection (EOF or reset) within ``timeout``."""
        try:
            while True:
                data = await asyncio.wait_for(self.reader.read(65536), timeout)
                if not data:
                    return True
        except (ConnectionError, OSError):
            return True
        except TimeoutError:
            return False

    async def close(self) -> None:
        """Close the socket."""
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()


class FactoryOf(FilterFactory[EmptyConfig]):
    """A filter factory calling ``make()`` per connection (for filters defined in tests)."""

    def __init__(self, make: Callable[[], ProxyFilter], name: str = "vc") -> None:
        super().__init__(
            EmptyConfig(),
            FilterFactoryContext(virtual_cluster=name, config=BergstreamConfig(), plugins=None),  # type: ignore[arg-type]
        )
        self.make = make

    def create_filter(self) -> ProxyFilter:
        """A new filter."""
        return self.make()


def self_signed_cert(directory: Path, name: str = "proxy") -> tuple[Path, Path]:
    """A self-signed certificate for localhost/127.0.0.1 (``openssl`` CLI); (cert, key)."""
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


class _ErrorCollector(logging.Handler):
    """Collects ERROR lines that reveal bugs: asyncio's unhandled errors, proxy internal errors."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__(logging.DEBUG)
        self.errors = errors

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if (record.name == "asyncio" and record.levelno >= logging.ERROR) or (
            "internal error" in message
        ):
            self.errors.append(message)


@dataclass
class FuzzTarget:
    """A running proxy under fuzzing: its address and the internal errors logged meanwhile."""

    address: str
    errors: list[str]
    #: How many inputs were sent to this proxy so far.
    examples: int = 0

    @classmethod
    @contextlib.asynccontextmanager
    async def running(cls, bootstrap: str, **cluster: Any) -> AsyncIterator[FuzzTarget]:
        """Start a proxy in front of ``bootstrap`` (``cluster``: more :func:`cluster_config`
        settings) and collect errors until the block ends."""
        from bergstream.core.proxy.server import ProxyServer

        server = ProxyServer(cluster_config(bootstrap, **cluster), [])
        await server.start()
        errors: list[str] = []
        handler = _ErrorCollector(errors)
        loggers = [logging.getLogger("asyncio"), logging.getLogger("bergstream.proxy")]
        for item in loggers:
            item.addHandler(handler)
        try:
            yield cls(f"127.0.0.1:{server.cluster.gateway.port}", errors)
        finally:
            for item in loggers:
                item.removeHandler(handler)
            await server.stop()
