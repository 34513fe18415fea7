"""The target cluster: connecting to its brokers and learning where each node lives.

The node map (node id -> real host and port) comes from Metadata responses: those clients
receive through the proxy (fed in by the address-rewrite filter) and, on a miss, one the proxy
asks a bootstrap broker for itself.

Security: every upstream connection speaks TLS when ``target.kafka_client`` (or the older
``target.tls``) says so. A client's connection carries the client's own SASL exchange, passed
through untouched, so the broker authenticates and authorizes the client itself; the proxy's own
connections (the Metadata above) authenticate with ``target.kafka_client``'s identity.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import struct
from collections.abc import Callable
from typing import Any, TypeVar

from kio.static.protocol import RequestPayload, ResponsePayload

from bergstream.core.config import TargetClusterConfig
from bergstream.core.kafka_client import KafkaSettingsError
from bergstream.core.kafka_sasl import KafkaAuthenticationError, open_kafka_connection
from bergstream.core.kafka_wire.api_keys import ApiKey
from bergstream.core.proxy import codec
from bergstream.core.proxy.log import ProxyLogAdapter
from bergstream.core.proxy.tls import client_ssl_context
from bergstream.core.proxy.versions import KIO_VERSIONS

CLIENT_ID = "bergstream-proxy"

P = TypeVar("P", bound=asyncio.BaseProtocol)
Address = tuple[str, int]


class UpstreamError(Exception):
    """The target cluster could not be reached or did not answer as expected."""


class TargetCluster:
    """Connections to one real Kafka cluster and its node map."""

    def __init__(
        self, config: TargetClusterConfig, *, connect_timeout: float, log: ProxyLogAdapter
    ) -> None:
        self.config = config
        self.bootstrap: list[Address] = config.addresses()
        self.client_settings = config.kafka_client
        self.ssl = (
            client_ssl_context(config.tls)
            if config.tls is not None
            else self.client_settings.ssl_context()
        )
        self.connect_timeout = connect_timeout
        self.log = log
        self._nodes: dict[int, Address] = {}
        self._refresh_lock = asyncio.Lock()
        self._next_bootstrap = 0

    @property
    def nodes(self) -> dict[int, Address]:
        """A copy of the known node map."""
        return dict(self._nodes)

    def update_nodes(self, nodes: dict[int, Address]) -> None:
        """Record node addresses seen in a Metadata response."""
        if any(self._nodes.get(node) != address for node, address in nodes.items()):
            self._nodes.update(nodes)

    async def node_address(self, node_id: int) -> Address | None:
        """Real address of ``node_id``; asks the cluster on a miss; None if it has no such node."""
        address = self._nodes.get(node_id)
        if address is not None:
            return address
        async with self._refresh_lock:
            if node_id not in self._nodes:
                await self.refresh_nodes()
        return self._nodes.get(node_id)

    def _bootstrap_order(self) -> list[Address]:
        start = self._next_bootstrap % len(self.bootstrap)
        self._next_bootstrap += 1
        return self.bootstrap[start:] + self.bootstrap[:start]

    async def _open(self, factory: Callable[[], P], address: Address) -> tuple[Any, P]:
        loop = asyncio.get_running_loop()
        host, port = address
        return await asyncio.wait_for(
            loop.create_connection(
                factory,
                host,
                port,
                ssl=self.ssl,
                server_hostname=host if self.ssl is not None else None,
            ),
            self.connect_timeout,
        )

    async def connect(
        self, factory: Callable[[], P], node_id: int | None
    ) -> tuple[asyncio.Transport, P, Address]:
        """Connect to node ``node_id`` (or any bootstrap broker for None).

        Raises :class:`UpstreamError` naming every address tried and why it failed.
        """
        if node_id is None:
            candidates = self._bootstrap_order()
        else:
            address = await self.node_address(node_id)
            if address is None:
                raise UpstreamError(
                    f"node {node_id} is not in the target cluster's metadata "
                    f"(known nodes: {sorted(self._nodes) or 'none'})"
                )
            candidates = [address]
        failures = []
        for address in candidates:
            try:
                transport, protocol = await self._open(factory, address)
                return transport, protocol, address
            except (OSError, TimeoutError) as error:
                reason = str(error) or type(error).__name__
                if isinstance(error, TimeoutError):
                    reason = f"no connection within {self.connect_timeout:g}s"
                elif isinstance(error, ssl.SSLCertVerificationError):
                    reason += (
                        "; check target.kafka_client's ssl.ca.location and "
                        "ssl.endpoint.identification.algorithm"
                    )
                elif isinstance(error, ssl.SSLError):
                    reason += (
                        "; does the broker listener speak TLS? (target.kafka_client's "
                        "security.protocol says it does)"
                    )
                failures.append(f"{address[0]}:{address[1]} ({reason})")
        raise UpstreamError(f"cannot connect to the target cluster: {'; '.join(failures)}")

    async def refresh_nodes(self) -> None:
        """Ask a bootstrap broker for Metadata and replace the node map with its brokers."""
        failures = []
        for host, port in self._bootstrap_order():
            try:
                nodes = await asyncio.wait_for(self._fetch_nodes(host, port), self.connect_timeout)
            except KafkaAuthenticationError as error:
                failures.append(
                    f"{host}:{port} (authentication as target.kafka_client's sasl.username "
                    f"failed: {error})"
                )
                continue
            except (OSError, TimeoutError, UpstreamError, codec.CodecError) as error:
                failures.append(f"{host}:{port} ({error or type(error).__name__})")
                continue
            self._nodes = nodes
            self.log.debug("target cluster nodes: %s", nodes)
            return
        raise UpstreamError(f"cannot read the target cluster's metadata: {'; '.join(failures)}")

    async def _fetch_nodes(self, host: str, port: int) -> dict[int, Address]:
        if self.client_settings.uses_sasl:
            try:
                reader, writer = await open_kafka_connection(
                    host,
                    port,
                    self.client_settings,
                    client_id=CLIENT_ID,
                    timeout=self.connect_timeout,
                )
            except KafkaSettingsError as error:
                raise UpstreamError(str(error)) from None
        else:
            reader, writer = await asyncio.open_connection(
                host, port, ssl=self.ssl, server_hostname=host if self.ssl is not None else None
            )
        try:
            versions = await _call(
                reader, writer, 1, codec.build(codec.request_schema(ApiKey.API_VERSIONS, 0))
            )
            broker = {entry.api_key: entry for entry in versions.api_keys}  # type: ignore[attr-defined]
            if ApiKey.METADATA not in broker:
                raise UpstreamError("the broker does not list the Metadata API")
            low = max(broker[ApiKey.METADATA].min_version, KIO_VERSIONS[ApiKey.METADATA][0], 1)
            high = min(broker[ApiKey.METADATA].max_version, KIO_VERSIONS[ApiKey.METADATA][1])
            if low > high:
                raise UpstreamError("no Metadata version in common with the broker")
            metadata = await _call(
                reader, writer, 2, codec.build(codec.request_schema(ApiKey.METADATA, high))
            )
            return {
                b.node_id: (b.host, b.port)
                for b in metadata.brokers  # type: ignore[attr-defined]
            }
        finally:
            writer.close()
            with contextlib.suppress(OSError, ConnectionError):
                await writer.wait_closed()


async def _call(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    correlation_id: int,
    payload: RequestPayload,
) -> ResponsePayload:
    """Send one request on a plain stream and read its response (for the proxy's own calls)."""
    api_key, api_version = payload.__api_key__, payload.__version__
    header = codec.make_request_header(api_key, api_version, correlation_id, CLIENT_ID)
    writer.write(codec.encode_request(header, payload))
    await writer.drain()
    try:
        (length,) = struct.unpack(">i", await reader.readexactly(4))
        if not 4 <= length <= 64 * 1024 * 1024:
            raise UpstreamError(f"broker sent a response frame of {length} bytes")
        message = await reader.readexactly(length)
    except asyncio.IncompleteReadError:
        raise UpstreamError("the broker closed the connection") from None
    received_id, response = codec.decode_response(api_key, api_version, message)
    if received_id != correlation_id:
        raise UpstreamError(f"expected correlation id {correlation_id}, got {received_id}")
    return response
