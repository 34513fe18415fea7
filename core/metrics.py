"""Prometheus metrics of core (the proxy) and the ones several plugins share.

Metrics live on ``prometheus_client``'s default registry, so one ``bergstream run`` process
exposes all of them on one endpoint (:mod:`.metrics_http`): core's here, each plugin's in its own
module (ISK's in ``plugins/isk_gateway/metrics.py``, KSI's in ``plugins/ksi_fetch_filter/
metrics.py``); a third-party plugin defines its own the same way. Names and labels are part of
the operations docs (``docs/operations.md``); change them there too.
"""

from __future__ import annotations

from prometheus_client import Counter

__all__ = [
    "PROXY_BYTES",
    "PROXY_REQUESTS",
    "UNDECODABLE_RECORDS",
]

PROXY_REQUESTS = Counter(
    "bergstream_proxy_requests",
    "Kafka requests the proxy received from clients",
    ["virtual_cluster", "api_key"],
)
PROXY_BYTES = Counter(
    "bergstream_proxy_bytes",
    "Kafka frame bytes through the proxy (request: client to broker; response: broker to client)",
    ["virtual_cluster", "api_key", "direction"],
)
UNDECODABLE_RECORDS = Counter(
    "bergstream_undecodable_records",
    "Record values (side=value) or keys (side=key) that did not decode and were kept as bytes "
    "(component: pipeline, isk, ksi; cause: the cause's text up to its first colon)",
    ["component", "topic", "side", "cause"],
)
