"""One client connection through the proxy: its upstream connection and its filter chain.

The chain is ``[ApiVersionsCap] + user filters (config order) + [BrokerAddressRewrite]``; index 0
is next to the client. Requests run through it upwards, responses downwards.

:class:`ProxyConnection` is the asyncio protocol on the client socket. This module sets it up
(the filter chain, the upstream connection) and tears it down; the rest of its work is done by
the parts it is made of, one module each (their fields are in :mod:`.connection_state`):

* :mod:`.request_path` -- client to broker. Hot path: a request whose API key no filter wants
  is forwarded as bytes, only its 8-byte header prefix rewritten (the proxy numbers upstream
  correlation ids itself, so out-of-band requests never collide with the client's).
* :mod:`.response_path` -- broker to client. A response no filter wants is cut through: its
  8-byte prefix is rewritten back to the client's correlation id and its body forwarded chunk by
  chunk, as views of the received bytes, without ever being assembled. Only frames some filter
  asked for are buffered whole and decoded with kio.
* :mod:`.response_order` -- responses reach the client in request order, whatever mix of
  broker answers, short-circuits and error responses produced them.
* :mod:`.flow_control` -- backpressure: a full client transport pauses reading from the broker
  and vice versa.
* :mod:`.sasl_relay` -- the client's SASL exchanges, during which the proxy's own requests wait.
* :mod:`.out_of_band` -- requests filters send themselves, and each filter's context.

Counting: every client request frame and every response frame written to the client is counted
per API key into plain integers of the virtual cluster's :class:`~.stats.ClusterStats` (one dict
lookup and an addition or two per frame), which the server publishes to Prometheus once a second.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from bergstream.core.proxy.api import ProxyFilter
from bergstream.core.proxy.chain import FilterChain
from bergstream.core.proxy.connection_state import next_connection_id
from bergstream.core.proxy.flow_control import BACKLOG_LIMIT, WRITE_HIGH, WRITE_LOW
from bergstream.core.proxy.frames import write_pieces
from bergstream.core.proxy.internal_filters import ApiVersionsCap, BrokerAddressRewrite
from bergstream.core.proxy.log import ProxyLogAdapter
from bergstream.core.proxy.out_of_band import FilterContextImpl, OutOfBand, RequestDropped
from bergstream.core.proxy.request_path import RequestPath
from bergstream.core.proxy.response_path import MAX_RESPONSE_BYTES, ResponsePath
from bergstream.core.proxy.upstream import UpstreamError

# Names other modules and tests import from here (defined in the modules of the parts).
__all__ = [
    "BACKLOG_LIMIT",
    "MAX_RESPONSE_BYTES",
    "WRITE_HIGH",
    "WRITE_LOW",
    "FilterContextImpl",
    "ProxyConnection",
    "RequestDropped",
    "next_connection_id",
    "write_pieces",
]


class _UpstreamProtocol(asyncio.Protocol):
    """Forwards the broker side's transport events to the connection."""

    def __init__(self, connection: ProxyConnection) -> None:
        self.connection = connection

    def data_received(self, data: bytes) -> None:
        """Bytes from the broker."""
        self.connection.upstream_data(data)

    def eof_received(self) -> bool:
        """The broker closed its side."""
        self.connection.upstream_lost(None)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        """The broker connection closed or broke."""
        self.connection.upstream_lost(exc)

    def pause_writing(self) -> None:
        """The broker's transport buffer is full: stop reading from the client."""
        self.connection.pause_client("upstream-full")

    def resume_writing(self) -> None:
        """The broker's transport buffer drained."""
        self.connection.resume_client("upstream-full")


class ProxyConnection(RequestPath, ResponsePath, OutOfBand):
    """The proxy's side of one client connection (an asyncio protocol on the client socket).

    Built with the keyword arguments of :class:`~.connection_state.ConnectionState`:
    ``cluster``, ``target``, ``node_id``, ``filter_factories``, ``on_closed`` and ``stats``.
    """

    def _build_chain(self) -> None:
        """Create this connection's filters and the chain that runs them."""
        filters: list[ProxyFilter] = [ApiVersionsCap()]
        filters.extend(factory.create_filter() for factory in self._factories)
        filters.append(
            BrokerAddressRewrite(self.cluster.gateway, self.cluster.name, self.target.update_nodes)
        )
        contexts = [FilterContextImpl(self, i) for i in range(len(filters))]
        self._chain = FilterChain(filters, contexts, self.log)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Accept a client: build its filter chain and connect upstream."""
        assert isinstance(transport, asyncio.Transport)
        loop = asyncio.get_running_loop()
        self.closed = loop.create_future()
        self._upstream_ready = loop.create_future()
        self._client = transport
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:
            self.client_address = f"{peer[0]}:{peer[1]}"
        self.log = ProxyLogAdapter(self.cluster.name, self.client_address)
        transport.set_write_buffer_limits(high=WRITE_HIGH, low=WRITE_LOW)
        port = transport.get_extra_info("sockname")
        self.log.debug(
            "client connected (connection %d, port %s, node %s)",
            self.connection_id,
            port[1] if isinstance(port, tuple) else port,
            "bootstrap" if self.node_id is None else self.node_id,
        )
        try:
            self._build_chain()
        except Exception as error:
            self.log.debug("filter creation failed", exc_info=True)
            self.close(f"creating the filter chain failed: {error!r}", level=logging.ERROR)
            return
        self.pause_client("connecting")
        self._spawn(self._connect())

    async def _connect(self) -> None:
        """Connect to the broker this connection's port serves, then start reading the client."""
        try:
            transport, _, address = await self.target.connect(
                lambda: _UpstreamProtocol(self), self.node_id
            )
        except UpstreamError as error:
            self.close(str(error))
            return
        if self._closing:
            transport.close()
            return
        self._upstream = transport
        self.upstream_address = address
        transport.set_write_buffer_limits(high=WRITE_HIGH, low=WRITE_LOW)
        self.log.debug("connected upstream to %s:%d", *address)
        assert self._upstream_ready is not None
        self._upstream_ready.set_result(None)
        if self._upstream_pauses:  # pauses asked for before the transport existed
            transport.pause_reading()
        self.resume_client("connecting")
        self._pump_requests()

    def close(
        self, reason: str | None = None, *, level: int = logging.WARNING, exc_info: Any = None
    ) -> None:
        """Close the client and upstream connections once, logging ``reason`` if given."""
        if self._closing:
            return
        self._closing = True
        if reason:
            self.log.log(level, "closing connection: %s", reason, exc_info=exc_info)
        for transport in (self._client, self._upstream):
            if transport is not None:
                transport.close()
        current = asyncio.current_task()
        for task in list(self._tasks):
            if task is not current:
                task.cancel()
        for pending in self._inflight.values():
            if pending.future is not None and not pending.future.done():
                pending.future.set_exception(ConnectionError("the client connection closed"))
        self._inflight.clear()
        if self._upstream_ready is not None and not self._upstream_ready.done():
            self._upstream_ready.set_exception(ConnectionError("the client connection closed"))
            self._upstream_ready.exception()  # retrieved: nobody may be waiting
        self._req_q.clear()
        self._resp_q.clear()
        self._deferred.clear()
        self._close_task = asyncio.get_running_loop().create_task(self._finish_close())

    async def _finish_close(self) -> None:
        """Close the filters, tell the server, resolve ``closed``."""
        await self._chain.close()
        if self._on_closed is not None:
            self._on_closed(self)
        if self.closed is not None and not self.closed.done():
            self.closed.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        """The client went away."""
        if exc is None:
            self.close("client closed the connection", level=logging.DEBUG)
        else:
            self.close(f"client connection lost: {exc}", level=logging.INFO)

    def eof_received(self) -> bool:
        """The client half-closed: Kafka clients never do that while talking, so close."""
        self.close("client closed the connection", level=logging.DEBUG)
        return False

    def upstream_lost(self, exc: Exception | None) -> None:
        """The broker closed the connection (logged at INFO) or it broke (WARNING)."""
        if self._closing:
            return
        address = self.upstream_address
        where = f"{address[0]}:{address[1]}" if address else "the broker"
        if exc is None:
            self.close(f"upstream connection to {where} closed by the broker", level=logging.INFO)
        else:
            self.close(f"upstream connection to {where} failed: {exc}")
