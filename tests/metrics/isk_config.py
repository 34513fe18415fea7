"""The config of a ``bergstream run`` with one ``isk`` service and the metrics endpoint (on a free
port), as the metrics, Prometheus and status page tests run it."""

from __future__ import annotations

from pathlib import Path


def isk_yaml(
    tmp_path: Path,
    kafka_bootstrap: str,
    cluster: str,
    *,
    chunk_records: int = 16,
    index_interval_seconds: float | None = None,
    catalog_port: int = 0,
    s3_port: int = 0,
) -> str:
    """The ``services:`` and ``metrics:`` sections (index and cache under ``tmp_path``); add a
    ``lake:`` section for the coldset."""
    service = [
        "services:",
        "  - type: isk",
        "    config:",
        f"      cluster: {cluster}",
        f'      kafka_bootstrap: "{kafka_bootstrap}"',
        f"      chunk_records: {chunk_records}",
        "      http:",
        f"        catalog_port: {catalog_port}",
        f"        s3_port: {s3_port}",
        "        access_key: isk-metrics",
        "        secret_key: isk-metrics-secret",
        f'      index: {{type: sqlite, config: {{path: "{tmp_path / "index.sqlite"}"}}}}',
        f'      cache: {{type: local, config: {{directory: "{tmp_path / "cache"}"}}}}',
        "metrics: {port: 0}",
    ]
    if index_interval_seconds is not None:
        service.insert(6, f"      index_interval_seconds: {index_interval_seconds}")
    return "\n" + "\n".join(service) + "\n"
