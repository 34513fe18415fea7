"""A test kit for proxy filters: drive a filter's hooks with no proxy and no broker.

:class:`FakeFilterContext` is the :class:`~bergstream.core.proxy.api.FilterContext` a filter gets
on a connection; out-of-band requests (``context.send_request``) are recorded and answered by the
test's own ``upstream`` function. :func:`wire_round_trip` encodes a request or response the way
the proxy would send it and decodes it back, so a test also proves that what a filter built is a
valid message of its API version::

    from bergstream.core.api import ApiKey, FakeFilterContext, Forward, build_request
    from bergstream.core.api import make_request_header, wire_round_trip

    async def test_adds_a_header():
        context = FakeFilterContext()
        header = make_request_header(ApiKey.PRODUCE, 9, correlation_id=1, client_id="t")
        action = await MyFilter().on_request(header, build_request(ApiKey.PRODUCE, 9), context)
        assert isinstance(action, Forward)
        wire_round_trip(header, action.payload)

Importing this module does not import pytest.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from kio.static.constants import EntityType
from kio.static.protocol import RequestHeader, RequestPayload, ResponsePayload

from bergstream.core.proxy.codec import (
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)

__all__ = ["FakeFilterContext", "Upstream", "wire_round_trip"]

#: Answers an out-of-band request in a test: returns (or awaits to) the broker's response.
Upstream = Callable[[RequestPayload], ResponsePayload | Awaitable[ResponsePayload]]


def _test_log() -> logging.LoggerAdapter[logging.Logger]:
    return logging.LoggerAdapter(logging.getLogger("bergstream.testing.filter"), {})


@dataclass
class FakeFilterContext:
    """The connection a filter runs on, for a unit test.

    ``sent`` lists every out-of-band request in order; ``upstream`` answers them (a plain or an
    async function). A request with no ``upstream`` given fails the test, naming the request.
    """

    virtual_cluster: str = "test"
    client_address: str = "127.0.0.1:50000"
    connection_id: int = 1
    node_id: int | None = None
    upstream: Upstream | None = None
    sent: list[RequestPayload] = field(default_factory=list)
    log: logging.LoggerAdapter[logging.Logger] = field(default_factory=_test_log)

    async def send_request(
        self, request: RequestPayload, *, timeout: float = 30.0
    ) -> ResponsePayload:
        """Record ``request`` and answer it with ``upstream``."""
        self.sent.append(request)
        if self.upstream is None:
            raise AssertionError(
                f"the filter sent a {type(request).__name__} request upstream, but the test "
                "gave FakeFilterContext no upstream= to answer it"
            )
        answer = self.upstream(request)
        if inspect.isawaitable(answer):
            answer = await answer
        return answer


def wire_round_trip(
    header: RequestHeader, message: RequestPayload | ResponsePayload
) -> RequestPayload | ResponsePayload:
    """``message`` (a request, or the response to the request ``header`` describes) encoded as
    the proxy sends it and decoded back; raises if it is not valid for its API version."""
    if message.__type__ is EntityType.request:
        frame = encode_request(header, message)  # type: ignore[arg-type]
        return decode_request(memoryview(frame)[4:])[1]
    frame = encode_response(header.correlation_id, message)
    _, decoded = decode_response(message.__api_key__, message.__version__, memoryview(frame)[4:])
    return decoded
