"""Request and byte counters of the proxy, prebound per virtual cluster and API key.

The pass-through path counts every frame, so it must not pay for ``Counter.labels(...)`` (a
label tuple, a dict lookup under a lock) each time: :class:`ClusterStats` resolves the labelled
children of an API key once and keeps them in a plain dict, leaving one dict lookup and a few
``inc`` calls per frame.
"""

from __future__ import annotations

from typing import Final

from prometheus_client.metrics import Counter

from bergstream.core.metrics import PROXY_BYTES, PROXY_REQUESTS
from bergstream.core.proxy.versions import KIO_VERSIONS, api_name

#: Label of API keys the codec does not know: a client sending random keys must not be able to
#: create one time series per key.
UNKNOWN_API: Final = "unknown"


def api_label(api_key: int) -> str:
    """The Kafka name of an API (``Fetch``, ``ListOffsets``, ...) or ``unknown``."""
    if api_key not in KIO_VERSIONS:
        return UNKNOWN_API
    return "".join(part.capitalize() for part in api_name(api_key).split("_"))


class ApiStats:
    """The counters of one (virtual cluster, API key)."""

    __slots__ = ("request_bytes", "requests", "response_bytes")

    def __init__(self, virtual_cluster: str, api: str) -> None:
        self.requests: Counter = PROXY_REQUESTS.labels(virtual_cluster=virtual_cluster, api_key=api)
        self.request_bytes: Counter = PROXY_BYTES.labels(
            virtual_cluster=virtual_cluster, api_key=api, direction="request"
        )
        self.response_bytes: Counter = PROXY_BYTES.labels(
            virtual_cluster=virtual_cluster, api_key=api, direction="response"
        )


class ClusterStats:
    """The counters of one virtual cluster, shared by all its connections.

    ``by_key`` maps API key numbers to their :class:`ApiStats`; a hot loop reads it directly
    and falls back to :meth:`api` for a key not seen yet.
    """

    __slots__ = ("_by_label", "by_key", "virtual_cluster")

    def __init__(self, virtual_cluster: str) -> None:
        self.virtual_cluster = virtual_cluster
        self.by_key: dict[int, ApiStats] = {}
        self._by_label: dict[str, ApiStats] = {}

    def api(self, api_key: int) -> ApiStats:
        """The counters of ``api_key`` (created on first use; unknown keys share one set and
        are never added to ``by_key``, so random keys cannot grow it)."""
        found = self.by_key.get(api_key)
        if found is None:
            label = api_label(api_key)
            found = self._by_label.get(label)
            if found is None:
                found = self._by_label[label] = ApiStats(self.virtual_cluster, label)
            if label != UNKNOWN_API:
                self.by_key[api_key] = found
        return found

    def request(self, api_key: int, size: int) -> None:
        """Count one client request frame of ``size`` bytes (length prefix included)."""
        stats = self.by_key.get(api_key) or self.api(api_key)
        stats.requests.inc()
        stats.request_bytes.inc(size)

    def response(self, api_key: int, size: int) -> None:
        """Count ``size`` response bytes written to the client (length prefix included)."""
        (self.by_key.get(api_key) or self.api(api_key)).response_bytes.inc(size)


_clusters: dict[str, ClusterStats] = {}


def cluster_stats(virtual_cluster: str) -> ClusterStats:
    """The process-wide :class:`ClusterStats` of ``virtual_cluster``."""
    found = _clusters.get(virtual_cluster)
    if found is None:
        found = _clusters[virtual_cluster] = ClusterStats(virtual_cluster)
    return found
