"""The Prometheus metrics of ``bergstream pipeline run`` (served with ``--metrics-port``, on the
default registry with core's); names and labels are documented in docs/operations.md."""

from __future__ import annotations

import json
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

__all__ = [
    "BATCH_SECONDS",
    "COMMIT_SECONDS",
    "FAILURES",
    "LAST_COMMIT",
    "RECORDS",
    "SOURCE_LAG",
    "WRITTEN_BYTES",
    "failure_cause",
    "record_source_progress",
]

_SECONDS_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)

RECORDS = Counter(
    "bergstream_pipeline_records",
    "Records the pipeline copied into the topic's table",
    ["topic"],
)
WRITTEN_BYTES = Counter(
    "bergstream_pipeline_written_bytes",
    "Bytes of data files the pipeline wrote into the topic's table",
    ["topic"],
)
BATCH_SECONDS = Histogram(
    "bergstream_pipeline_batch_seconds",
    "Time of one micro-batch, from Spark handing it over to its commit and state update",
    ["topic"],
    buckets=_SECONDS_BUCKETS,
)
COMMIT_SECONDS = Histogram(
    "bergstream_pipeline_commit_seconds",
    "Time of one micro-batch's Iceberg append (writing its files and committing the snapshot)",
    ["topic"],
    buckets=_SECONDS_BUCKETS,
)
LAST_COMMIT = Gauge(
    "bergstream_pipeline_last_commit_timestamp_seconds",
    "Unix time of the pipeline's last commit to the topic's table (age: time() - this)",
    ["topic"],
)
SOURCE_LAG = Gauge(
    "bergstream_pipeline_source_lag_offsets",
    "Kafka's latest offset minus the end of the last batch, as the pipeline's source last saw it",
    ["topic", "partition"],
)
FAILURES = Counter(
    "bergstream_pipeline_failures",
    "Micro-batches or runs that failed, by cause (the error's kind)",
    ["topic", "cause"],
)


def failure_cause(error: BaseException) -> str:
    """A short, stable label for what made a batch or run fail: the Java exception's class
    where Spark wraps one, else the Python one."""
    java = getattr(error, "java_exception", None)
    if java is not None:
        try:
            return str(java.getClass().getSimpleName())
        except Exception:  # the JVM may be gone by now
            pass
    return type(error).__name__


def record_source_progress(topic: str, progress: dict[str, Any] | None) -> None:
    """Set :data:`SOURCE_LAG` from a streaming query's ``lastProgress``: for each partition,
    the source's ``latestOffset`` minus the batch's ``endOffset``."""
    if not progress:
        return
    for source in progress.get("sources", ()):
        latest = _offsets(source.get("latestOffset"))
        end = _offsets(source.get("endOffset"))
        for partition, offset in latest.get(topic, {}).items():
            done = end.get(topic, {}).get(partition, offset)
            SOURCE_LAG.labels(topic, str(partition)).set(max(int(offset) - int(done), 0))


def _offsets(value: Any) -> dict[str, dict[str, int]]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return value if isinstance(value, dict) else {}
