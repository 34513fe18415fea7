"""The filter chain of one connection: who sees which message, and running the hooks.

Index 0 is next to the client, the last index next to the broker. A request runs through the
filters that want its API key upwards from some start index; a response runs downwards through
the filters that want it. Filter misbehaviour (an exception, a wrong action or payload type)
becomes :class:`CloseRequested`, which closes only that connection.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, NamedTuple

from kio.static.protocol import RequestHeader, RequestPayload, ResponsePayload

from bergstream.core.kafka_wire.api_keys import ApiKey
from bergstream.core.proxy.api import (
    CloseConnection,
    Drop,
    ErrorResponse,
    FilterContext,
    Forward,
    ProxyFilter,
    ShortCircuit,
)
from bergstream.core.proxy.errors import ErrorResponseNotSupported, build_error_response
from bergstream.core.proxy.frames import Buffer, ChunkedBuffer
from bergstream.core.proxy.internal_filters import InternalFilter, ProxyConfigError
from bergstream.core.proxy.versions import api_name, is_supported


class CloseRequested(Exception):
    """The connection must close; ``reason`` is the log line, ``level`` its level."""

    def __init__(self, reason: str, level: int = logging.WARNING) -> None:
        super().__init__(reason)
        self.reason = reason
        self.level = level


class Outcome(NamedTuple):
    """Where a request ended up after the filters."""

    kind: str  # "forward" (to the broker), "respond" (answered by a filter) or "drop"
    request: Any  # the request as the last filter left it
    response: Any  # the filter's answer for "respond"
    index: int  # the filter that answered or dropped; len(chain) for "forward"


def wants_response(item: ProxyFilter, api_key: int, api_version: int) -> bool:
    """Whether ``item`` sees responses of this API version."""
    if isinstance(item, InternalFilter):
        return item.wants_response(api_key, api_version)
    return api_key in item.response_api_keys


def check_payload(filter_name: str, kind: str, header: RequestHeader, payload: Any) -> None:
    """A filter's payload must be a kio ``kind`` ("request"/"response") of the header's API."""
    expected = (header.request_api_key, header.request_api_version)
    found = (getattr(payload, "__api_key__", None), getattr(payload, "__version__", None))
    if expected[0] == ApiKey.API_VERSIONS and not is_supported(*expected):
        expected = (ApiKey.API_VERSIONS, 0)  # brokers answer unknown ApiVersions versions in v0
    entity_type = getattr(payload, "__type__", None)
    if found != expected or getattr(entity_type, "name", None) != kind:
        raise CloseRequested(
            f"filter {filter_name} returned {type(payload).__name__} as the {kind} to "
            f"{api_name(expected[0])} v{expected[1]}: it must be a kio {kind} of that API "
            f"and version",
            logging.ERROR,
        )


class FilterChain:
    """The filters of one connection with their contexts, and the routing tables."""

    def __init__(
        self,
        filters: Sequence[ProxyFilter],
        contexts: Sequence[FilterContext],
        log: logging.LoggerAdapter[logging.Logger],
    ) -> None:
        self.filters = list(filters)
        self.contexts = list(contexts)
        self.log = log
        wanted: dict[int, list[int]] = {}
        for index, item in enumerate(self.filters):
            for key in item.request_api_keys:
                wanted.setdefault(key, []).append(index)
        self._request_filters = {key: tuple(indexes) for key, indexes in wanted.items()}
        #: API keys whose requests some filter wants decoded.
        self.request_keys = frozenset(wanted)
        self._response_cache: dict[tuple[int, int], tuple[int, ...]] = {}

    def __len__(self) -> int:
        return len(self.filters)

    def response_filters(self, api_key: int, api_version: int) -> tuple[int, ...]:
        """Indexes of the filters that see this response, from the broker side down."""
        key = (api_key, api_version)
        found = self._response_cache.get(key)
        if found is None:
            found = tuple(
                index
                for index in range(len(self.filters) - 1, -1, -1)
                if wants_response(self.filters[index], api_key, api_version)
            )
            self._response_cache[key] = found
        return found

    def raw_allowed(
        self,
        indexes: Sequence[int],
        api_key: int,
        api_version: int,
        message: Buffer | ChunkedBuffer,
    ) -> bool:
        """True if only internal filters want this response and none needs it decoded."""
        for index in indexes:
            item = self.filters[index]
            if not isinstance(item, InternalFilter) or item.needs_decode(
                api_key, api_version, message
            ):
                return False
        return True

    def _failed(self, index: int, error: Exception) -> CloseRequested:
        name = type(self.filters[index]).__name__
        if isinstance(error, ProxyConfigError):
            return CloseRequested(str(error), logging.ERROR)
        self.log.debug("filter %s raised", name, exc_info=error)
        return CloseRequested(f"filter {name} failed: {error!r}", logging.ERROR)

    async def run_request(
        self, start: int, header: RequestHeader, request: RequestPayload
    ) -> Outcome:
        """Run ``on_request`` of the filters from ``start`` up that want this API key."""
        api_key = header.request_api_key
        for index in self._request_filters.get(api_key, ()):
            if index < start:
                continue
            item = self.filters[index]
            name = type(item).__name__
            try:
                action = await item.on_request(header, request, self.contexts[index])
            except Exception as error:
                raise self._failed(index, error) from error
            kind = type(action)
            if kind is Forward:
                check_payload(name, "request", header, action.payload)
                request = action.payload
            elif kind is ShortCircuit:
                check_payload(name, "response", header, action.response)
                return Outcome("respond", request, action.response, index)
            elif kind is ErrorResponse:
                try:
                    response = build_error_response(
                        header, request, action.error_code, action.message
                    )
                except (ErrorResponseNotSupported, ValueError) as error:
                    raise CloseRequested(
                        f"filter {name} asked for error {action.error_code} in answer to "
                        f"{api_name(api_key)} v{header.request_api_version}: {error}"
                    ) from None
                return Outcome("respond", request, response, index)
            elif kind is Drop:
                return Outcome("drop", request, None, index)
            elif kind is CloseConnection:
                raise CloseRequested(f"filter {name} closed the connection: {action.reason}")
            else:
                raise self._failed(
                    index, TypeError(f"on_request returned {action!r}, not a request action")
                )
        return Outcome("forward", request, None, len(self.filters))

    async def run_response(
        self, indexes: Sequence[int], header: RequestHeader, response: ResponsePayload
    ) -> ResponsePayload | None:
        """Run ``on_response`` of the filters ``indexes`` in order; None if one dropped it."""
        for index in indexes:
            item = self.filters[index]
            name = type(item).__name__
            try:
                action = await item.on_response(header, response, self.contexts[index])
            except Exception as error:
                raise self._failed(index, error) from error
            kind = type(action)
            if kind is Forward:
                check_payload(name, "response", header, action.payload)
                response = action.payload
            elif kind is Drop:
                return None
            elif kind is CloseConnection:
                raise CloseRequested(f"filter {name} closed the connection: {action.reason}")
            else:
                raise self._failed(
                    index, TypeError(f"on_response returned {action!r}, not a response action")
                )
        return response

    async def close(self) -> None:
        """Call every filter's ``on_close``; failures are logged, not raised."""
        for index, item in enumerate(self.filters):
            try:
                await item.on_close(self.contexts[index])
            except Exception:
                self.log.warning("filter %s failed in on_close", type(item).__name__, exc_info=True)
