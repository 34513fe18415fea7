"""The filter API of the proxy, modelled on Kroxylicious.

A :class:`FilterFactory` is created once per virtual cluster from its typed config; it creates one
:class:`ProxyFilter` per client connection, so a filter holds per-connection state and needs no
locks. A filter declares the API keys whose requests and responses it wants decoded; every other
frame passes through the proxy as opaque bytes.

Requests flow client -> internal filters -> user filters (in config order) -> broker-address
rewriting -> broker; responses flow back in reverse. Each hook returns an action saying what the
proxy does next.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

from pydantic import BaseModel

if TYPE_CHECKING:
    from kio.static.protocol import RequestHeader, RequestPayload, ResponsePayload

    from bergstream.core.config import BergstreamConfig
    from bergstream.core.plugins import PluginRegistry


@dataclass(frozen=True, slots=True)
class Forward:
    """Pass the (possibly replaced) payload on to the next filter, then the broker or client."""

    payload: Any


@dataclass(frozen=True, slots=True)
class ShortCircuit:
    """Answer the client with ``response`` at once; the request goes no further upstream.

    Only valid from :meth:`ProxyFilter.on_request`. The response passes back through the filters
    that stand between this filter and the client.
    """

    response: Any


@dataclass(frozen=True, slots=True)
class ErrorResponse:
    """Answer the request with ``error_code`` (a Kafka error code) in every error slot.

    Only valid from :meth:`ProxyFilter.on_request`, for the APIs the proxy can build an error
    response for (see :func:`bergstream.core.proxy.errors.build_error_response`); for any other
    API the proxy closes the connection instead and logs why.
    """

    error_code: int
    message: str | None = None


@dataclass(frozen=True, slots=True)
class Drop:
    """Drop the message: a dropped request gets no response, a dropped response never arrives."""


@dataclass(frozen=True, slots=True)
class CloseConnection:
    """Close the client connection (and its upstream connection) after logging ``reason``."""

    reason: str


RequestAction = Forward | ShortCircuit | ErrorResponse | Drop | CloseConnection
ResponseAction = Forward | Drop | CloseConnection


class FilterContext(Protocol):
    """What a filter can see and do on its connection."""

    @property
    def virtual_cluster(self) -> str:
        """Name of the virtual cluster this connection belongs to."""
        ...

    @property
    def client_address(self) -> str:
        """``host:port`` of the connected client."""
        ...

    @property
    def connection_id(self) -> int:
        """Proxy-wide unique number of this client connection (for logs and per-client state)."""
        ...

    @property
    def node_id(self) -> int | None:
        """Broker node id this connection is bound to, or None on the bootstrap port."""
        ...

    @property
    def log(self) -> logging.LoggerAdapter[logging.Logger]:
        """Logger that tags every line with the virtual cluster and the client."""
        ...

    async def send_request(
        self, request: RequestPayload, *, timeout: float = 30.0
    ) -> ResponsePayload:
        """Send an out-of-band request upstream and await its response.

        The request passes only through the filters between the caller and the broker; its
        response returns to the caller only, never to the client.
        """
        ...


class ProxyFilter:
    """Base class of a per-connection filter: override the hooks you need.

    ``request_api_keys`` and ``response_api_keys`` name the API keys whose messages this filter
    wants decoded; the proxy never calls it for other keys.
    """

    request_api_keys: ClassVar[frozenset[int]] = frozenset()
    response_api_keys: ClassVar[frozenset[int]] = frozenset()

    async def on_request(
        self, header: RequestHeader, request: RequestPayload, context: FilterContext
    ) -> RequestAction:
        """Called for each client request whose API key is in ``request_api_keys``."""
        return Forward(request)

    async def on_response(
        self, header: RequestHeader, response: ResponsePayload, context: FilterContext
    ) -> ResponseAction:
        """Called for each response whose API key is in ``response_api_keys``.

        ``header`` is the header of the request this response answers, as the client sent it.
        """
        return Forward(response)

    async def on_close(self, context: FilterContext) -> None:
        """Called once when the client connection closes, for any cleanup."""


@dataclass(frozen=True)
class FilterFactoryContext:
    """What a filter factory gets at initialisation, once per virtual cluster."""

    virtual_cluster: str
    config: BergstreamConfig
    plugins: PluginRegistry


ConfigT = TypeVar("ConfigT", bound=BaseModel)


class FilterFactory(ABC, Generic[ConfigT]):
    """Builds filters for one virtual cluster from a validated config model.

    ``__init__`` runs once per virtual cluster when the proxy starts (Kroxylicious' ``initialize``);
    :meth:`create_filter` runs once per client connection.
    """

    def __init__(self, config: ConfigT, context: FilterFactoryContext) -> None:
        self.config = config
        self.context = context

    async def start(self) -> None:
        """Optional async initialisation (open catalogs, connections) before the first client."""

    @abstractmethod
    def create_filter(self) -> ProxyFilter:
        """Return a new filter for one client connection."""

    async def close(self) -> None:
        """Release what :meth:`start` acquired; called when the proxy stops."""
