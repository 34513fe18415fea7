"""Prometheus metrics of one bergstream process.

Every component counts into the metric objects defined here (module level, on
``prometheus_client``'s default registry, so one ``bergstream run`` process exposes all of them on
one endpoint). Names and labels are part of the operations docs (``docs/operations.md``); change
them there too.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

__all__ = [
    "CACHE_REQUESTS",
    "INDEX_LAG",
    "ISK_KAFKA_READ_BYTES",
    "ISK_LOAD_TABLES",
    "ISK_SYNTHESIZED_BYTES",
    "KSI_COLD_FETCHES",
    "KSI_COLD_RECORDS",
    "PIPELINE_LAG",
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
KSI_COLD_FETCHES = Counter(
    "bergstream_ksi_cold_fetches",
    "Fetch partitions KSI answered from the Iceberg coldset",
    ["virtual_cluster", "topic"],
)
KSI_COLD_RECORDS = Counter(
    "bergstream_ksi_cold_records",
    "Records KSI served from the Iceberg coldset",
    ["virtual_cluster", "topic"],
)
ISK_LOAD_TABLES = Counter(
    "bergstream_isk_load_tables",
    "Iceberg LoadTable calls ISK answered",
    ["cluster", "namespace"],
)
ISK_SYNTHESIZED_BYTES = Counter(
    "bergstream_isk_synthesized_bytes",
    "Bytes of files ISK synthesized (kind: data, manifest, manifest_list, metadata)",
    ["cluster", "kind"],
)
ISK_KAFKA_READ_BYTES = Counter(
    "bergstream_isk_kafka_read_bytes",
    "Record batch bytes ISK read from Kafka (purpose: index, serve)",
    ["cluster", "purpose"],
)
CACHE_REQUESTS = Counter(
    "bergstream_cache_requests",
    "Cache lookups per backend (result: hit, miss, error)",
    ["backend", "result"],
)
INDEX_LAG = Gauge(
    "bergstream_isk_index_lag_offsets",
    "Offsets between Kafka's last stable offset and the end of ISK's chunk index",
    ["cluster", "topic", "partition"],
)
PIPELINE_LAG = Gauge(
    "bergstream_pipeline_lag_offsets",
    "Kafka high watermark minus the coldset boundary (offsets not yet in the coldset)",
    ["cluster", "topic", "partition"],
)
UNDECODABLE_RECORDS = Counter(
    "bergstream_undecodable_records",
    "Record values (side=value) or keys (side=key) that did not decode and were kept as bytes "
    "(component: pipeline, isk, ksi; cause: the cause's text up to its first colon)",
    ["component", "topic", "side", "cause"],
)
