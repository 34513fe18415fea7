"""What every part of one client connection shares (:class:`ConnectionState`) and the two
records it keeps per request (:class:`Slot`, :class:`Pending`).

A :class:`~bergstream.core.proxy.connection.ProxyConnection` is put together from parts, each a
class in its own module built on this one:

* :mod:`~bergstream.core.proxy.flow_control` -- backpressure between the two sockets;
* :mod:`~bergstream.core.proxy.response_order` -- responses written in request order;
* :mod:`~bergstream.core.proxy.sasl_relay` -- the client's SASL exchanges passed through;
* :mod:`~bergstream.core.proxy.request_path` -- client to broker;
* :mod:`~bergstream.core.proxy.response_path` -- broker to client;
* :mod:`~bergstream.core.proxy.out_of_band` -- requests filters send themselves;
* :mod:`~bergstream.core.proxy.connection` -- set-up and tear-down.

Every field lives here, so one place says what a connection holds; each part reads and writes
the fields its job needs.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from kio.static.protocol import RequestHeader, ResponsePayload

from bergstream.core.config import VirtualClusterConfig
from bergstream.core.proxy.api import FilterFactory
from bergstream.core.proxy.chain import CloseRequested, FilterChain
from bergstream.core.proxy.frames import Buffer, ByteQueue
from bergstream.core.proxy.log import ProxyLogAdapter
from bergstream.core.proxy.stats import ClusterStats, cluster_stats
from bergstream.core.proxy.upstream import TargetCluster

if TYPE_CHECKING:
    from bergstream.core.proxy.connection import ProxyConnection

_connection_ids = itertools.count(1)


def next_connection_id() -> int:
    """A proxy-wide unique connection number."""
    return next(_connection_ids)


class Slot:
    """A response the client is owed, kept in request order until it can be written."""

    __slots__ = ("api_key", "correlation_id", "done", "pieces")

    def __init__(self, correlation_id: int, api_key: int) -> None:
        self.correlation_id = correlation_id
        self.api_key = api_key
        self.pieces: list[Buffer] = []
        self.done = False


class Pending:
    """A request sent upstream, awaiting its response."""

    __slots__ = ("api_key", "api_version", "filters", "future", "header", "slot")

    def __init__(
        self,
        slot: Slot | None,
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


class ConnectionState(asyncio.Protocol):
    """The fields of one client connection, its background tasks and correlation ids."""

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
        # Who this connection is (read by filters through their context).
        self.cluster = cluster
        self.stats = stats if stats is not None else cluster_stats(cluster.name)
        self.target = target
        self.node_id = node_id
        self.connection_id = next_connection_id()
        self.client_address = "?"
        self.client_id: str | None = None  # the Kafka client.id, once the first request came
        self.log = ProxyLogAdapter(cluster.name)
        # Set-up and tear-down (connection).
        self._factories = filter_factories
        self._on_closed = on_closed
        self._max_frame = cluster.max_frame_bytes
        self._chain = FilterChain([], [], self.log)
        self._client: asyncio.Transport | None = None
        self._upstream: asyncio.Transport | None = None
        self.upstream_address: tuple[str, int] | None = None
        self._upstream_ready: asyncio.Future[None] | None = None
        # Bytes received and not yet handled (request_path, response_path).
        self._req_q = ByteQueue()
        self._resp_q = ByteQueue()
        self._req_busy = False  # a request is with the filters: later ones wait in _req_q
        self._resp_busy = False  # a response is with the filters: later ones wait in _deferred
        self._stream_left = 0  # bytes of the cut-through response still to come
        self._deferred: deque[tuple[Pending, list[memoryview]]] = deque()
        self._deferred_bytes = 0
        # What the client is owed, in order (response_order), and what the broker owes.
        self._slots: deque[Slot] = deque()
        self._inflight: dict[int, Pending] = {}
        self._next_id = 0
        # Why each side is not read (flow_control).
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

    def close(
        self, reason: str | None = None, *, level: int = logging.WARNING, exc_info: Any = None
    ) -> None:
        """Close the client and upstream connections once, logging ``reason`` if given
        (:class:`~bergstream.core.proxy.connection.ProxyConnection` implements it)."""
        raise NotImplementedError

    def _new_correlation_id(self) -> int:
        """The next correlation id of a request sent upstream (the proxy numbers them)."""
        self._next_id = (self._next_id + 1) & 0x7FFFFFFF
        return self._next_id

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` as a task of this connection, cancelled when it closes."""
        task = asyncio.get_running_loop().create_task(self._guard(coro))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _guard(self, coro: Coroutine[Any, Any, None]) -> None:
        """Await ``coro``; a :class:`CloseRequested` or a bug closes this connection only."""
        try:
            await coro
        except CloseRequested as error:
            self.close(error.reason, level=error.level)
        except Exception as error:  # a bug: close this connection only
            self.close(f"internal error: {error!r}", level=logging.ERROR, exc_info=True)
