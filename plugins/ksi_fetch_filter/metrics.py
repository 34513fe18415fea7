"""KSI's Prometheus metrics (on the default registry, exposed by the process's metrics
endpoint with core's); names and labels are documented in docs/operations.md."""

from __future__ import annotations

from prometheus_client import Counter

__all__ = ["KSI_COLD_FETCHES", "KSI_COLD_RECORDS"]

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
