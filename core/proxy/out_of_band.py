"""Requests a filter sends itself on its client's connection (out-of-band), and the filter's
view of the connection (:class:`FilterContextImpl`) through which it sends them.

An out-of-band request runs through the filters after the sender's, then goes to the broker
under a correlation id of the proxy's; its response runs back through the same filters and
resolves a future instead of filling a client slot. It waits while a SASL exchange of the
client's is under way.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

from kio.static.protocol import RequestPayload, ResponsePayload

from bergstream.core.kafka_wire.api_keys import ApiKey
from bergstream.core.proxy import codec
from bergstream.core.proxy.chain import CloseRequested
from bergstream.core.proxy.connection_state import Pending
from bergstream.core.proxy.request_path import encode_request
from bergstream.core.proxy.sasl_relay import SaslRelay
from bergstream.core.proxy.upstream import CLIENT_ID
from bergstream.core.proxy.versions import api_name


class RequestDropped(Exception):
    """An out-of-band request was dropped by a filter and will get no response."""


class OutOfBand(SaslRelay):
    """Sending a filter's own request upstream and awaiting its response."""

    async def send_request(
        self, index: int, request: RequestPayload, timeout: float
    ) -> ResponsePayload:
        """Send ``request`` for filter ``index`` through the filters above it to the broker."""
        if self._closing or self._upstream_ready is None:
            raise ConnectionError("the connection is closed")
        await self._upstream_ready
        await self._wait_sasl_idle(timeout)
        api_key, api_version = request.__api_key__, request.__version__
        header = codec.make_request_header(api_key, api_version, 0, CLIENT_ID)
        try:
            outcome = await self._chain.run_request(index + 1, header, request)
        except CloseRequested as error:
            self.close(error.reason, level=error.level)
            raise ConnectionError(error.reason) from None
        response_filters = self._chain.response_filters(api_key, api_version)
        if outcome.kind == "drop":
            raise RequestDropped(f"a filter dropped the out-of-band {api_name(api_key)} request")
        if outcome.kind == "respond":
            filters = tuple(i for i in response_filters if index < i < outcome.index)
            response = await self._chain.run_response(filters, header, outcome.response)
            if response is None:
                raise RequestDropped(f"a filter dropped the {api_name(api_key)} response")
            return response
        if api_key == ApiKey.PRODUCE and outcome.request.acks == 0:
            raise ValueError("a Produce request with acks=0 gets no response: use acks=1 or -1")
        upstream_id = self._new_correlation_id()
        sent = replace(header, correlation_id=upstream_id)
        frame = encode_request(sent, outcome.request)
        future: asyncio.Future[ResponsePayload] = asyncio.get_running_loop().create_future()
        filters = tuple(i for i in response_filters if i > index)
        self._inflight[upstream_id] = Pending(None, api_key, api_version, sent, filters, future)
        assert self._upstream is not None
        self._upstream.write(frame)
        return await asyncio.wait_for(future, timeout)


class FilterContextImpl:
    """The :class:`~bergstream.core.proxy.api.FilterContext` of one filter on one connection."""

    __slots__ = ("_connection", "_index")

    def __init__(self, connection: OutOfBand, index: int) -> None:
        self._connection = connection
        self._index = index

    @property
    def virtual_cluster(self) -> str:
        """Name of the virtual cluster."""
        return self._connection.cluster.name

    @property
    def client_address(self) -> str:
        """``host:port`` of the client."""
        return self._connection.client_address

    @property
    def connection_id(self) -> int:
        """Proxy-wide unique number of the connection."""
        return self._connection.connection_id

    @property
    def node_id(self) -> int | None:
        """The node this connection's port serves, None on the bootstrap port."""
        return self._connection.node_id

    @property
    def log(self) -> logging.LoggerAdapter[logging.Logger]:
        """Logger tagging lines with the virtual cluster and client."""
        return self._connection.log

    async def send_request(
        self, request: RequestPayload, *, timeout: float = 30.0
    ) -> ResponsePayload:
        """Send ``request`` upstream through the filters after this one; return the response."""
        return await self._connection.send_request(self._index, request, timeout)
