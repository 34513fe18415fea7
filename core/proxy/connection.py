"""One client connection through the proxy: its upstream connection and its filter chain.

The chain is ``[ApiVersionsCap] + user filters (config order) + [BrokerAddressRewrite]``; index 0
is next to the client. Requests run through it upwards, responses downwards.

Hot path: a request whose API key no filter wants is forwarded as bytes, only its 8-byte header
prefix rewritten (the proxy numbers upstream correlation ids itself, so out-of-band requests never
collide with the client's). A response no filter wants is cut through: its 8-byte prefix is
rewritten back to the client's correlation id and its body forwarded chunk by chunk, as views
of the received bytes, without ever being assembled. Only frames some filter asked for are
buffered whole and decoded with kio.

Counting: every client request frame and every response frame written to the client is counted
per API key into plain integers of the virtual cluster's :class:`~.stats.ClusterStats` (one dict
lookup and an addition or two per frame), which the server publishes to Prometheus once a second.

Order: responses reach the client in request order, whatever mix of broker answers,
short-circuits and error responses produced them (``_slots``). Backpressure: a full client
transport pauses reading from the broker and vice versa.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import replace
from typing import Any

from kio.schema.request_header.v2 import RequestHeader as RequestHeaderV2
from kio.static.protocol import RequestHeader, RequestPayload, ResponsePayload

from bergstream.core.config import VirtualClusterConfig
from bergstream.core.kafka_wire.api_keys import ApiKey
from bergstream.core.proxy import codec
from bergstream.core.proxy.api import (
    FilterFactory,
    ProxyFilter,
)
from bergstream.core.proxy.chain import CloseRequested, FilterChain, Outcome
from bergstream.core.proxy.frames import (
    REQUEST_PEEK_SIZE,
    RESPONSE_PEEK_SIZE,
    Buffer,
    ByteQueue,
    ChunkedBuffer,
    FrameError,
    check_length,
    drop_prefix,
    peek_request,
    peek_request_header,
    produce_acks,
    request_prefix,
    response_prefix,
    take_frame,
)
from bergstream.core.proxy.internal_filters import (
    ApiVersionsCap,
    BrokerAddressRewrite,
)
from bergstream.core.proxy.log import ProxyLogAdapter
from bergstream.core.proxy.stats import ClusterStats, cluster_stats
from bergstream.core.proxy.upstream import CLIENT_ID, TargetCluster, UpstreamError
from bergstream.core.proxy.versions import api_name

# Read once: on Python 3.11 each ``ApiKey.PRODUCE`` costs an enum lookup (~65 ns), and the
# pass-through path compares every request's key with it.
_PRODUCE = ApiKey.PRODUCE
_SASL_HANDSHAKE = ApiKey.SASL_HANDSHAKE
# What a client may send while it (re-)authenticates; any other request means it is done.
_DURING_SASL = frozenset({ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE, ApiKey.API_VERSIONS})

#: Transport write-buffer limits: above HIGH the other side stops being read.
WRITE_HIGH = 4 * 1024 * 1024
WRITE_LOW = 1024 * 1024
#: Unprocessed bytes queued from one side before that side stops being read.
BACKLOG_LIMIT = 4 * 1024 * 1024
#: Responses come from the trusted broker: only a negative length is refused.
MAX_RESPONSE_BYTES = 2**31 - 1
#: Pieces smaller than this are joined into one write (one syscall).
_JOIN_BELOW = 64 * 1024

_connection_ids = itertools.count(1)


def next_connection_id() -> int:
    """A proxy-wide unique connection number."""
    return next(_connection_ids)


def write_pieces(transport: asyncio.WriteTransport, pieces: Sequence[Buffer]) -> None:
    """Write ``pieces`` in order; small neighbours are joined, large ones written as views."""
    if len(pieces) == 1:
        transport.write(pieces[0])
        return
    batch: list[Buffer] = []
    for piece in pieces:
        if len(piece) >= _JOIN_BELOW:
            if batch:
                transport.write(b"".join(batch) if len(batch) > 1 else batch[0])
                batch = []
            transport.write(piece)
        else:
            batch.append(piece)
    if batch:
        transport.write(b"".join(batch) if len(batch) > 1 else batch[0])


class _Slot:
    """A response the client is owed, kept in request order until it can be written."""

    __slots__ = ("api_key", "correlation_id", "done", "pieces")

    def __init__(self, correlation_id: int, api_key: int) -> None:
        self.correlation_id = correlation_id
        self.api_key = api_key
        self.pieces: list[Buffer] = []
        self.done = False


class _Pending:
    """A request sent upstream, awaiting its response."""

    __slots__ = ("api_key", "api_version", "filters", "future", "header", "slot")

    def __init__(
        self,
        slot: _Slot | None,
        api_key: int,
        api_version: int,
        header: RequestHeader | None,
        filters: tuple[int, ...],
        future: asyncio.Future[ResponsePayload] | None = None,
    ) -> None:
        self.slot = slot  # the client's slot, or None for an out-of-band request
        self.api_key = api_key
        self.api_version = api_version
        self.header = header  # the request header as the filters saw it
        self.filters = filters  # indexes of the filters its response passes, in order
        self.future = future  # resolved with the response of an out-of-band request


class RequestDropped(Exception):
    """An out-of-band request was dropped by a filter and will get no response."""


class FilterContextImpl:
    """The :class:`~bergstream.core.proxy.api.FilterContext` of one filter on one connection."""

    __slots__ = ("_connection", "_index")

    def __init__(self, connection: ProxyConnection, index: int) -> None:
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


class _UpstreamProtocol(asyncio.Protocol):
    """Forwards the broker side's transport events to the connection."""

    def __init__(self, connection: ProxyConnection) -> None:
        self.connection = connection

    def data_received(self, data: bytes) -> None:
        self.connection.upstream_data(data)

    def eof_received(self) -> bool:
        self.connection.upstream_lost(None)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.connection.upstream_lost(exc)

    def pause_writing(self) -> None:
        self.connection.pause_client("upstream-full")

    def resume_writing(self) -> None:
        self.connection.resume_client("upstream-full")


class ProxyConnection(asyncio.Protocol):
    """The proxy's side of one client connection (an asyncio protocol on the client socket)."""

    def __init__(
        self,
        *,
        cluster: VirtualClusterConfig,
        target: TargetCluster,
        node_id: int | None,
        filter_factories: Sequence[FilterFactory[Any]] = (),
        on_closed: Callable[[ProxyConnection], None] | None = None,
        stats: ClusterStats | None = None,
    ) -> None:
        self.cluster = cluster
        self.stats = stats if stats is not None else cluster_stats(cluster.name)
        self.target = target
        self.node_id = node_id
        self.connection_id = next_connection_id()
        self.client_address = "?"
        self.client_id: str | None = None  # the Kafka client.id, once the first request came
        self.log = ProxyLogAdapter(cluster.name)
        self._factories = filter_factories
        self._on_closed = on_closed
        self._max_frame = cluster.max_frame_bytes
        self._chain = FilterChain([], [], self.log)
        self._client: asyncio.Transport | None = None
        self._upstream: asyncio.Transport | None = None
        self.upstream_address: tuple[str, int] | None = None
        self._upstream_ready: asyncio.Future[None] | None = None
        self._req_q = ByteQueue()
        self._resp_q = ByteQueue()
        self._req_busy = False
        self._resp_busy = False
        self._stream_left = 0
        self._deferred: deque[tuple[_Pending, list[memoryview]]] = deque()
        self._deferred_bytes = 0
        self._slots: deque[_Slot] = deque()
        self._inflight: dict[int, _Pending] = {}
        self._next_id = 0
        self._client_pauses: set[str] = set()
        self._upstream_pauses: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        # Set while no SASL exchange of the client's is under way: the proxy's own requests on
        # this connection wait for it, since a broker refuses anything else mid-exchange.
        self._sasl_idle = asyncio.Event()
        self._sasl_idle.set()
        self._close_task: asyncio.Task[None] | None = None
        self.closed: asyncio.Future[None] | None = None

    # ------------------------------------------------------------------ set-up and tear-down

    def _build_chain(self) -> None:
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

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(self._guard(coro))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _guard(self, coro: Coroutine[Any, Any, None]) -> None:
        try:
            await coro
        except CloseRequested as error:
            self.close(error.reason, level=error.level)
        except Exception as error:  # a bug: close this connection only
            self.close(f"internal error: {error!r}", level=logging.ERROR, exc_info=True)

    # ------------------------------------------------------------------ flow control

    def pause_client(self, reason: str) -> None:
        """Stop reading from the client until every pause reason is resumed."""
        if not self._client_pauses and self._client is not None:
            self._client.pause_reading()
        self._client_pauses.add(reason)

    def resume_client(self, reason: str) -> None:
        """Drop one pause reason; read from the client again when none is left."""
        if reason in self._client_pauses:
            self._client_pauses.discard(reason)
            if not self._client_pauses and self._client is not None and not self._closing:
                self._client.resume_reading()

    def _pause_upstream(self, reason: str) -> None:
        if not self._upstream_pauses and self._upstream is not None:
            self._upstream.pause_reading()
        self._upstream_pauses.add(reason)

    def _resume_upstream(self, reason: str) -> None:
        if reason in self._upstream_pauses:
            self._upstream_pauses.discard(reason)
            if not self._upstream_pauses and self._upstream is not None and not self._closing:
                self._upstream.resume_reading()

    def pause_writing(self) -> None:
        """The client's transport buffer is full: stop reading from the broker."""
        self._pause_upstream("client-full")

    def resume_writing(self) -> None:
        """The client's transport buffer drained."""
        self._resume_upstream("client-full")

    # ------------------------------------------------------------------ requests

    def data_received(self, data: bytes) -> None:
        """Bytes from the client."""
        if self._closing:
            return
        self._req_q.append(data)
        if self._req_busy or self._upstream is None:
            if len(self._req_q) > BACKLOG_LIMIT:
                self.pause_client("backlog")
            return
        self._pump_requests()

    def _new_correlation_id(self) -> int:
        self._next_id = (self._next_id + 1) & 0x7FFFFFFF
        return self._next_id

    def _pump_requests(self) -> None:
        """Forward every complete request frame; hand the first one a filter wants to a task."""
        queue = self._req_q
        out: list[Buffer] = []
        counters = self.stats.by_key
        try:
            while not self._req_busy and not self._closing:
                message = take_frame(queue, self._max_frame, REQUEST_PEEK_SIZE)
                if message is None:
                    break
                api_key, api_version, correlation_id = peek_request(message)
                if self.client_id is None:
                    self._learn_client_id(message)
                if api_key == _SASL_HANDSHAKE:
                    if api_version == 0:
                        self.close(
                            "the client sent SaslHandshake v0, whose SASL tokens follow as bare "
                            "bytes the proxy cannot relay: use a client that sends SaslHandshake "
                            "v1 (any Kafka client since 1.0; librdkafka since 0.11)"
                        )
                        return
                    self._sasl_idle.clear()
                elif not self._sasl_idle.is_set() and api_key not in _DURING_SASL:
                    self._sasl_idle.set()
                api = counters.get(api_key) or self.stats.api(api_key)
                api.requests += 1
                api.request_bytes += len(message) + 4
                if api_key in self._chain.request_keys:
                    self._req_busy = True
                    self._spawn(self._process_request(message))
                    break
                self._forward_raw(message, api_key, api_version, correlation_id, out)
        except FrameError as error:
            self.close(f"malformed request frame: {error}")
            return
        if out and self._upstream is not None:
            write_pieces(self._upstream, out)
        # Not busy: the queue holds at most one incomplete frame, which must be read whole.
        if not self._req_busy or len(queue) <= BACKLOG_LIMIT:
            self.resume_client("backlog")

    def _learn_client_id(self, message: Buffer) -> None:
        """Tag this connection's log lines with the client.id of its first request."""
        try:
            self.client_id = peek_request_header(message).client_id or ""
        except FrameError:
            self.client_id = ""  # the frame's own handling reports what is wrong with it
        if self.client_id:
            self.log = ProxyLogAdapter(self.cluster.name, self.client_address, self.client_id)
            self._chain.log = self.log
            self.log.debug("client.id is %r", self.client_id)

    def _header_for_filters(
        self, message: Buffer, api_key: int, api_version: int
    ) -> RequestHeader | None:
        """The request header response filters get; None when the response will be opaque."""
        try:
            return codec.decode_request_header(message)[0]
        except codec.UnsupportedMessage:
            if api_key != ApiKey.API_VERSIONS:
                return None
            # A newer ApiVersions than kio knows: the broker answers in v0, which we can cap.
            peek = peek_request_header(message)
            return RequestHeaderV2(
                request_api_key=api_key,  # type: ignore[arg-type]
                request_api_version=api_version,  # type: ignore[arg-type]
                correlation_id=peek.correlation_id,  # type: ignore[arg-type]
                client_id=peek.client_id,
            )
        except codec.MalformedMessage as error:
            raise FrameError(str(error)) from None

    def _forward_raw(
        self,
        message: Buffer,
        api_key: int,
        api_version: int,
        correlation_id: int,
        out: list[Buffer],
    ) -> None:
        """Send a request upstream as bytes, under a new correlation id."""
        upstream_id = self._new_correlation_id()
        if api_key != _PRODUCE or produce_acks(message, api_version) != 0:
            slot = _Slot(correlation_id, api_key)
            self._slots.append(slot)
            filters = self._chain.response_filters(api_key, api_version)
            header = None
            if filters:
                header = self._header_for_filters(message, api_key, api_version)
                if header is None:
                    filters = ()
            self._inflight[upstream_id] = _Pending(slot, api_key, api_version, header, filters)
        out.append(request_prefix(len(message), api_key, api_version, upstream_id))
        out.append(message[REQUEST_PEEK_SIZE:])

    async def _process_request(self, message: Buffer) -> None:
        """Decode a request some filter wants, run the chain, act on the outcome."""
        try:
            try:
                header, request = codec.decode_request(message)
            except codec.UnsupportedMessage as error:
                self.log.debug("passing a request through undecoded: %s", error)
                out: list[Buffer] = []
                self._forward_raw(message, *peek_request(message), out)
                if self._upstream is not None:
                    write_pieces(self._upstream, out)
                return
            except codec.MalformedMessage as error:
                raise CloseRequested(f"malformed request a filter asked for: {error}") from None
            outcome = await self._chain.run_request(0, header, request)
            await self._complete_client_request(header, outcome)
        except FrameError as error:
            raise CloseRequested(f"malformed request frame: {error}") from None
        finally:
            self._req_busy = False
        if not self._closing:
            self._pump_requests()

    async def _complete_client_request(self, header: RequestHeader, outcome: Outcome) -> None:
        api_key = header.request_api_key
        expects_response = api_key != ApiKey.PRODUCE or outcome.request.acks != 0
        if outcome.kind == "forward":
            upstream_id = self._new_correlation_id()
            sent = replace(header, correlation_id=upstream_id)
            frame = _encode_request(sent, outcome.request)
            if expects_response:
                slot = _Slot(header.correlation_id, api_key)
                self._slots.append(slot)
                filters = self._chain.response_filters(api_key, header.request_api_version)
                self._inflight[upstream_id] = _Pending(
                    slot, api_key, header.request_api_version, header, filters
                )
            if self._upstream is not None:
                self._upstream.write(frame)
            return
        if outcome.kind == "drop" or not expects_response:
            return
        slot = _Slot(header.correlation_id, api_key)
        self._slots.append(slot)
        filters = tuple(
            i
            for i in self._chain.response_filters(api_key, header.request_api_version)
            if i < outcome.index
        )
        response = await self._chain.run_response(filters, header, outcome.response)
        self._fill_slot(slot, response)

    # ------------------------------------------------------------------ out-of-band requests

    async def send_request(
        self, index: int, request: RequestPayload, timeout: float
    ) -> ResponsePayload:
        """Send ``request`` for filter ``index`` through the filters above it to the broker."""
        if self._closing or self._upstream_ready is None:
            raise ConnectionError("the connection is closed")
        await self._upstream_ready
        if not self._sasl_idle.is_set():
            await asyncio.wait_for(self._sasl_idle.wait(), timeout)
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
        frame = _encode_request(sent, outcome.request)
        future: asyncio.Future[ResponsePayload] = asyncio.get_running_loop().create_future()
        filters = tuple(i for i in response_filters if i > index)
        self._inflight[upstream_id] = _Pending(None, api_key, api_version, sent, filters, future)
        assert self._upstream is not None
        self._upstream.write(frame)
        return await asyncio.wait_for(future, timeout)

    # ------------------------------------------------------------------ responses

    def upstream_data(self, data: bytes) -> None:
        """Bytes from the broker: continue a cut-through frame, then parse the rest."""
        if self._closing:
            return
        left = self._stream_left
        if left:
            client = self._client
            assert client is not None
            size = len(data)
            if size <= left:
                client.write(data)
                self._stream_left = left - size
                if size == left:
                    self._end_stream(None)
                return
            view = memoryview(data)
            client.write(view[:left])
            data = view[left:]  # type: ignore[assignment]
            self._stream_left = 0
            self._end_stream(None)
        self._resp_q.append(data)
        self._pump_responses()

    def _end_stream(self, out: list[Buffer] | None) -> None:
        """The cut-through response at the head is complete: release the slots behind it."""
        self._slots.popleft()
        if self._slots and self._slots[0].done:
            self._flush_slots(out)

    def _flush_slots(self, out: list[Buffer] | None = None) -> None:
        """Write every finished response at the head of the queue."""
        pieces = [] if out is None else out
        slots = self._slots
        while slots and slots[0].done:
            pieces.extend(slots.popleft().pieces)
        if out is None and pieces and self._client is not None:
            write_pieces(self._client, pieces)

    def _fill_slot(self, slot: _Slot, response: ResponsePayload | None) -> None:
        """Put a filtered (or filter-made) response in its slot; None removes the slot."""
        if response is None:
            with contextlib.suppress(ValueError):
                self._slots.remove(slot)
        else:
            try:
                frame = codec.encode_response(slot.correlation_id, response)
            except codec.CodecError as error:
                raise CloseRequested(
                    f"a filter's response cannot be encoded: {error}", logging.ERROR
                ) from None
            self.stats.response(slot.api_key, len(frame))
            slot.pieces = [frame]
            slot.done = True
        self._flush_slots()

    def _pump_responses(self) -> None:
        """Deliver the complete (or cut-through) response frames queued from the broker.

        While a response is being filtered, later client responses are set aside whole
        (``_deferred``) and handled in order afterwards, but out-of-band responses are always
        handled at once: a filter awaiting one in ``on_response`` must not wait for itself.
        """
        queue = self._resp_q
        out: list[Buffer] = []
        slots = self._slots
        counters = self.stats.by_key
        try:
            while self._deferred and not self._resp_busy and not self._closing:
                pending, views = self._deferred.popleft()
                self._deferred_bytes -= sum(len(view) for view in views)
                self._deliver_buffered(pending, views, out)
            while not self._closing and not self._stream_left:
                size = len(queue)
                if size < 8:
                    if size >= 4:
                        check_length(queue.peek_int32(), MAX_RESPONSE_BYTES, RESPONSE_PEEK_SIZE)
                    break
                length = queue.peek_int32()
                check_length(length, MAX_RESPONSE_BYTES, RESPONSE_PEEK_SIZE)
                upstream_id = queue.peek_int32(4)
                pending = self._inflight.get(upstream_id)
                if pending is None:
                    raise FrameError(f"response with unknown correlation id {upstream_id}")
                slot = pending.slot
                if (
                    slot is not None
                    and not pending.filters
                    and not self._resp_busy
                    and slots
                    and slots[0] is slot
                ):
                    # Cut through: forward the body as it arrives.
                    del self._inflight[upstream_id]
                    api_key = pending.api_key
                    api = counters.get(api_key) or self.stats.api(api_key)
                    api.response_bytes += length + 4
                    queue.skip(8)
                    body = length - 4
                    views = queue.take_views(body)
                    out.append(response_prefix(length, slot.correlation_id))
                    out.extend(views)
                    body -= sum(len(view) for view in views)
                    if body:
                        self._stream_left = body
                        break
                    self._end_stream(out)
                    continue
                if size < 4 + length:
                    break
                del self._inflight[upstream_id]
                queue.skip(4)
                if pending.future is not None:
                    message = queue.take(length)
                    if not pending.future.done():  # else the caller gave up (timeout)
                        self._spawn(self._filter_response(pending, message))
                elif self._resp_busy:
                    self._deferred.append((pending, queue.take_views(length)))
                    self._deferred_bytes += length
                else:
                    self._deliver_buffered(pending, queue.take_views(length), out)
        except FrameError as error:
            self.close(f"bad response from the broker: {error}")
            return
        if out and self._client is not None:
            write_pieces(self._client, out)
        # What is left in the queue is at most one incomplete frame, which must be read whole:
        # only complete frames set aside behind a busy filter count as backlog.
        if self._deferred_bytes > BACKLOG_LIMIT:
            self._pause_upstream("backlog")
        else:
            self._resume_upstream("backlog")

    def _deliver_buffered(
        self, pending: _Pending, views: list[memoryview], out: list[Buffer]
    ) -> None:
        """Deliver a whole client response: raw if no filter needs it, else via a task.

        The response stays a list of views of the received chunks: a frame that needs no
        decoding (e.g. a Fetch v16+ response without node endpoints) is never joined.
        """
        slot = pending.slot
        assert slot is not None
        length = sum(len(view) for view in views)
        if not pending.filters or self._chain.raw_allowed(
            pending.filters,
            pending.api_key,
            pending.api_version,
            views[0] if len(views) == 1 else ChunkedBuffer(views),
        ):
            slot.pieces = [response_prefix(length, slot.correlation_id), *drop_prefix(views, 4)]
            slot.done = True
            self.stats.response(pending.api_key, length + 4)
            self._flush_slots(out)
            return
        message = views[0] if len(views) == 1 else b"".join(views)
        self._resp_busy = True
        self._spawn(self._process_response(pending, message))

    async def _process_response(self, pending: _Pending, message: Buffer) -> None:
        """Filter one client response, then go on with the responses queued behind it."""
        try:
            await self._filter_response(pending, message)
        finally:
            self._resp_busy = False
        if not self._closing:
            self._pump_responses()

    async def _filter_response(self, pending: _Pending, message: Buffer) -> None:
        """Decode a response, run its filters, deliver it to the client slot or the caller."""
        future = pending.future
        try:
            await self._decode_and_filter(pending, message)
        except BaseException as error:
            if future is not None and not future.done():  # the caller must not wait in vain
                reason = error.reason if isinstance(error, CloseRequested) else repr(error)
                future.set_exception(ConnectionError(reason))
            raise

    async def _decode_and_filter(self, pending: _Pending, message: Buffer) -> None:
        what = f"{api_name(pending.api_key)} v{pending.api_version} response"
        future, slot = pending.future, pending.slot
        try:
            _, response = codec.decode_response(pending.api_key, pending.api_version, message)
        except codec.UnsupportedMessage as error:
            self.log.debug("passing a %s through undecoded: %s", what, error)
            if future is not None:
                if not future.done():
                    future.set_exception(codec.UnsupportedMessage(str(error)))
            elif slot is not None:
                slot.pieces = [response_prefix(len(message), slot.correlation_id), message[4:]]
                slot.done = True
                self.stats.response(pending.api_key, len(message) + 4)
                self._flush_slots()
            return
        except codec.MalformedMessage as error:
            raise CloseRequested(f"undecodable {what} from the broker: {error}") from None
        assert pending.header is not None
        result = await self._chain.run_response(pending.filters, pending.header, response)
        if future is not None:
            if not future.done():
                if result is None:
                    future.set_exception(RequestDropped(f"a filter dropped the {what}"))
                else:
                    future.set_result(result)
        elif slot is not None:
            self._fill_slot(slot, result)


def _encode_request(header: RequestHeader, request: RequestPayload) -> bytes:
    try:
        return codec.encode_request(header, request)
    except codec.CodecError as error:
        raise CloseRequested(
            f"cannot encode the filtered request: {error}", logging.ERROR
        ) from None
