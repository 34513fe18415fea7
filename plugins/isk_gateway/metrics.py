"""ISK's Prometheus metrics (on the default registry, exposed by the process's metrics
endpoint with core's); names and labels are documented in docs/operations.md."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

__all__ = [
    "CACHE_REQUESTS",
    "COALESCED_FILES",
    "INDEX_LAG",
    "ISK_KAFKA_READ_BYTES",
    "ISK_LOAD_TABLES",
    "ISK_SYNTHESIZED_BYTES",
    "PIPELINE_LAG",
]

ISK_LOAD_TABLES = Counter(
    "bergstream_isk_load_tables",
    "Iceberg LoadTable calls ISK answered",
    ["cluster", "namespace"],
)
COALESCED_FILES = Counter(
    "bergstream_isk_coalesced_runs",
    "Runs of small hotset files ISK read and indexed again as one file",
    ["cluster", "topic"],
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
