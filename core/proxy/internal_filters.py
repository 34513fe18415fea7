"""The proxy's own filters, wrapped around every user chain.

* :class:`ApiVersionsCap` runs first (next to the client): it intersects the broker's
  ApiVersions answer with what kio can decode and drops API keys kio does not know, so clients
  only ever speak versions the proxy understands.
* :class:`BrokerAddressRewrite` runs last (next to the broker): every broker address a response
  carries (Metadata, FindCoordinator, DescribeCluster, ``node_endpoints`` of Produce v10+, Fetch
  v16+, ShareFetch and ShareAcknowledge) becomes the gateway's host and the proxy port of that
  node, so clients never learn a real broker address.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any, ClassVar

from kio.static.protocol import RequestHeader, ResponsePayload

from bergstream.core.config import GatewayConfig
from bergstream.core.kafka_wire.api_keys import ApiKey
from bergstream.core.proxy.api import FilterContext, Forward, ProxyFilter, ResponseAction
from bergstream.core.proxy.frames import Buffer, ChunkedBuffer
from bergstream.core.proxy.scan import fetch_response_has_tags, produce_response_has_tags
from bergstream.core.proxy.versions import KIO_VERSIONS


class InternalFilter(ProxyFilter):
    """A built-in filter that may want responses of some versions only, or only some frames."""

    def wants_response(self, api_key: int, api_version: int) -> bool:
        """Whether responses of this API version must be buffered and offered to this filter."""
        return api_key in self.response_api_keys

    def needs_decode(self, api_key: int, api_version: int, message: Buffer | ChunkedBuffer) -> bool:
        """Cheap check on a buffered response message: does this filter need it decoded?"""
        return True


class ProxyConfigError(Exception):
    """The proxy's config cannot serve what the target cluster returned (logged, then closed)."""


def cap_api_versions(response: Any) -> Any:
    """Intersect an ApiVersions response with kio's versions; drop API keys kio lacks."""
    kept = []
    for entry in response.api_keys:
        bounds = KIO_VERSIONS.get(entry.api_key)
        if bounds is None:
            continue
        low = max(entry.min_version, bounds[0])
        high = min(entry.max_version, bounds[1])
        if low > high:
            continue
        if (low, high) != (entry.min_version, entry.max_version):
            entry = replace(entry, min_version=low, max_version=high)
        kept.append(entry)
    return replace(response, api_keys=tuple(kept))


class ApiVersionsCap(InternalFilter):
    """Caps ApiVersions responses to what the proxy's codec supports."""

    response_api_keys: ClassVar[frozenset[int]] = frozenset({ApiKey.API_VERSIONS})

    async def on_response(
        self, header: RequestHeader, response: ResponsePayload, context: FilterContext
    ) -> ResponseAction:
        """Replace the broker's version ranges by their intersection with kio's."""
        return Forward(cap_api_versions(response))


class BrokerAddressRewrite(InternalFilter):
    """Rewrites broker addresses in responses to the gateway's advertised host and ports.

    ``on_brokers`` receives the real ``node id -> (host, port)`` map of every Metadata response
    before it is rewritten, so the proxy learns where each node lives.
    """

    response_api_keys: ClassVar[frozenset[int]] = frozenset(
        {
            ApiKey.PRODUCE,
            ApiKey.FETCH,
            ApiKey.METADATA,
            ApiKey.FIND_COORDINATOR,
            ApiKey.DESCRIBE_CLUSTER,
            ApiKey.SHARE_FETCH,
            ApiKey.SHARE_ACKNOWLEDGE,
        }
    )

    def __init__(
        self,
        gateway: GatewayConfig,
        virtual_cluster: str,
        on_brokers: Callable[[dict[int, tuple[str, int]]], None] | None = None,
    ) -> None:
        self.gateway = gateway
        self.host = gateway.advertised_host or gateway.host
        self.virtual_cluster = virtual_cluster
        self.on_brokers = on_brokers

    def wants_response(self, api_key: int, api_version: int) -> bool:
        """Produce responses from v10 and Fetch responses from v16 carry node endpoints."""
        if api_key == ApiKey.PRODUCE:
            return api_version >= 10
        if api_key == ApiKey.FETCH:
            return api_version >= 16
        return api_key in self.response_api_keys

    def needs_decode(self, api_key: int, api_version: int, message: Buffer | ChunkedBuffer) -> bool:
        """Produce and Fetch responses need decoding only when they carry node endpoints."""
        if api_key == ApiKey.FETCH:
            return fetch_response_has_tags(message)
        if api_key == ApiKey.PRODUCE:
            return produce_response_has_tags(message, api_version)
        return True

    def port_for(self, node_id: int) -> int:
        """The proxy port of ``node_id``; :class:`ProxyConfigError` if it has none."""
        port = self.gateway.broker_port(node_id)
        if port is None:
            low = self.gateway.lowest_broker_id
            high = low + self.gateway.broker_count - 1
            raise ProxyConfigError(
                f"the target cluster has broker node id {node_id}, but the gateway of virtual "
                f"cluster '{self.virtual_cluster}' only has ports for node ids {low}..{high}: "
                f"raise gateway.broker_count or adjust gateway.lowest_broker_id"
            )
        return port

    def _rewrite(self, nodes: Iterable[Any], id_field: str = "node_id") -> tuple[Any, ...]:
        return tuple(
            replace(node, host=self.host, port=self.port_for(getattr(node, id_field)))
            for node in nodes
        )

    async def on_response(
        self, header: RequestHeader, response: ResponsePayload, context: FilterContext
    ) -> ResponseAction:
        """Rewrite the addresses of the response kinds listed in the class docstring."""
        return Forward(self.rewrite(header.request_api_key, response))

    def rewrite(self, api_key: int, response: Any) -> Any:
        """Return ``response`` with every broker address replaced by a proxy address."""
        if api_key == ApiKey.METADATA:
            if self.on_brokers is not None:
                self.on_brokers({b.node_id: (b.host, b.port) for b in response.brokers})
            return replace(response, brokers=self._rewrite(response.brokers))
        if api_key == ApiKey.FIND_COORDINATOR:
            if hasattr(response, "coordinators"):
                coordinators = tuple(
                    c
                    if c.node_id < 0
                    else replace(c, host=self.host, port=self.port_for(c.node_id))
                    for c in response.coordinators
                )
                return replace(response, coordinators=coordinators)
            if response.node_id < 0:
                return response
            return replace(response, host=self.host, port=self.port_for(response.node_id))
        if api_key == ApiKey.DESCRIBE_CLUSTER:
            return replace(response, brokers=self._rewrite(response.brokers, "broker_id"))
        if getattr(response, "node_endpoints", None):
            return replace(response, node_endpoints=self._rewrite(response.node_endpoints))
        return response
