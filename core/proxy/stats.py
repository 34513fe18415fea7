"""Request and byte counters of the proxy, per virtual cluster and API key.

The pass-through path counts every frame, so it must not pay for ``Counter.labels(...)`` nor for
``Counter.inc`` (a lock per call) each time. Connections add to plain integers of an
:class:`ApiStats` (one dict lookup and an integer addition or two per frame, on the event loop's
thread only), and :meth:`ClusterStats.publish`, run by the proxy once a second on the same
thread and once more when it stops, adds what grew to the Prometheus counters
(``bergstream_proxy_requests``, ``bergstream_proxy_bytes``). A scrape therefore sees the proxy's
counts at most :data:`PUBLISH_SECONDS` late.
"""

from __future__ import annotations

from typing import Final

from prometheus_client.metrics import Counter

from bergstream.core.metrics import PROXY_BYTES, PROXY_REQUESTS
from bergstream.core.proxy.versions import KIO_VERSIONS, api_name

#: Label of API keys the codec does not know: a client sending random keys must not be able to
#: create one time series per key.
UNKNOWN_API: Final = "unknown"

#: How often a running proxy adds its connections' counts to the Prometheus counters.
PUBLISH_SECONDS: Final = 1.0


def api_label(api_key: int) -> str:
    """The Kafka name of an API (``Fetch``, ``ListOffsets``, ...) or ``unknown``."""
    if api_key not in KIO_VERSIONS:
        return UNKNOWN_API
    return "".join(part.capitalize() for part in api_name(api_key).split("_"))


class ApiStats:
    """The counts of one (virtual cluster, API): plain integers the connections add to, and the
    labelled Prometheus counters they are published to."""

    __slots__ = ("_counters", "_published", "request_bytes", "requests", "response_bytes")

    def __init__(self, virtual_cluster: str, api: str) -> None:
        self.requests = 0
        self.request_bytes = 0
        self.response_bytes = 0
        self._counters: tuple[Counter, Counter, Counter] = (
            PROXY_REQUESTS.labels(virtual_cluster=virtual_cluster, api_key=api),
            PROXY_BYTES.labels(virtual_cluster=virtual_cluster, api_key=api, direction="request"),
            PROXY_BYTES.labels(virtual_cluster=virtual_cluster, api_key=api, direction="response"),
        )
        self._published = [0, 0, 0]

    def publish(self) -> None:
        """Add what the counts grew by since the last call to the Prometheus counters."""
        counts = (self.requests, self.request_bytes, self.response_bytes)
        for index, (counter, count) in enumerate(zip(self._counters, counts, strict=True)):
            grown = count - self._published[index]
            if grown:
                counter.inc(grown)
                self._published[index] = count


class ClusterStats:
    """The counts of one virtual cluster, shared by all its connections.

    ``by_key`` maps API key numbers to their :class:`ApiStats`; a hot loop reads it directly
    and falls back to :meth:`api` for a key not seen yet.
    """

    __slots__ = ("_by_label", "by_key", "virtual_cluster")

    def __init__(self, virtual_cluster: str) -> None:
        self.virtual_cluster = virtual_cluster
        self.by_key: dict[int, ApiStats] = {}
        self._by_label: dict[str, ApiStats] = {}

    def api(self, api_key: int) -> ApiStats:
        """The counts of ``api_key`` (created on first use; unknown keys share one set and
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
        stats.requests += 1
        stats.request_bytes += size

    def response(self, api_key: int, size: int) -> None:
        """Count ``size`` response bytes written to the client (length prefix included)."""
        (self.by_key.get(api_key) or self.api(api_key)).response_bytes += size

    def publish(self) -> None:
        """Add every API's new counts to the Prometheus counters; call it on the thread that
        counts (the event loop's)."""
        for stats in list(self._by_label.values()):
            stats.publish()


_clusters: dict[str, ClusterStats] = {}


def cluster_stats(virtual_cluster: str) -> ClusterStats:
    """The process-wide :class:`ClusterStats` of ``virtual_cluster``."""
    found = _clusters.get(virtual_cluster)
    if found is None:
        found = _clusters[virtual_cluster] = ClusterStats(virtual_cluster)
    return found
