"""ISK's part of the status page (``GET /`` on the metrics endpoint): per topic its table mode
and codec, per partition Kafka's log start and high watermark, the coldset boundary, the hot and
cold split and the lag; the coldset's snapshot history; undecodable and rejected records; the
cache's hit rate; and charts of the lag and the query rate over the last hour.

With principals (or an OAuth client) the page asks for the catalog's credentials and shows a
principal only the topics it may read, as the catalog does.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import time
from typing import TYPE_CHECKING, Any

from prometheus_client import REGISTRY

from bergstream.core.api import (
    BOUNDARY_PROPERTY,
    StatusChart,
    StatusSection,
    StatusTable,
    StatusUnauthorized,
    load_catalog,
    mode_rule_for,
    parse_boundary,
    rule_for,
)
from bergstream.plugins.isk_gateway.metrics import CACHE_REQUESTS, ISK_LOAD_TABLES, PIPELINE_LAG

if TYPE_CHECKING:
    from bergstream.plugins.isk_gateway.service import IskService

__all__ = ["IskStatus"]

#: Seconds between two samples of the charts, and how many are kept (an hour).
SAMPLE_SECONDS = 30.0
SAMPLES = 120
#: Topics the page lists at most (each costs a ListOffsets and a catalog read).
MAX_TOPICS = 200
#: Snapshots of each coldset table the page lists.
SNAPSHOTS = 5
#: Series a chart draws at most (the topics with the largest lag).
CHART_SERIES = 6


class IskStatus:
    """The status of one running ISK gateway, and the samples of its last hour."""

    def __init__(self, service: IskService) -> None:
        self.service = service
        self.samples: collections.deque[tuple[float, dict[str, float], float]] = collections.deque(
            maxlen=SAMPLES
        )

    def sample(self) -> None:
        """Keep the lag per topic and the LoadTable count now (the charts' points)."""
        self.samples.append(self.measure())

    def measure(self) -> tuple[float, dict[str, float], float]:
        """The lag per topic and the LoadTable count now."""
        cluster = self.service.config.cluster
        lag: dict[str, float] = collections.defaultdict(float)
        for labels, value in _samples(PIPELINE_LAG):
            if labels.get("cluster") == cluster:
                lag[labels["topic"]] += value
        loads = sum(
            v for labels, v in _samples(ISK_LOAD_TABLES) if labels.get("cluster") == cluster
        )
        return time.time(), dict(lag), loads

    async def run_sampler(self, interval: float = SAMPLE_SECONDS) -> None:
        """Sample every ``interval`` seconds until cancelled."""
        while True:
            self.sample()
            await asyncio.sleep(interval)

    async def sections(self, authorization: str | None) -> list[StatusSection]:
        """The page's section for a request with this ``Authorization`` header."""
        readable = await self._readable(authorization)
        service = self.service
        reader = service.reader
        topics: list[str] = []
        if reader is not None:
            with contextlib.suppress(Exception):  # Kafka down: the page still answers
                topics = sorted(t for t in await reader.topics() if not t.startswith("__"))
        if readable is not None:
            topics = [t for t in topics if t in readable]
        shown = topics[:MAX_TOPICS]
        rows = await asyncio.gather(*(self._topic(topic) for topic in shown))
        history = await asyncio.to_thread(self._lake_history, shown)
        undecodable = _undecodable()
        topic_rows, partition_rows = [], []
        for topic, (mode, codec, partitions) in zip(shown, rows, strict=True):
            kafka = sum(p[3] - p[1] for p in partitions)
            cold = sum(p[2] or 0 for p in partitions)
            hot = sum(p[4] for p in partitions)
            lag = (
                sum(p[5] or 0 for p in partitions)
                if any(p[2] is not None for p in partitions)
                else None
            )
            rejected = history.get(topic, {}).get("rejected")
            topic_rows.append(
                (
                    topic,
                    mode,
                    codec,
                    len(partitions),
                    kafka,
                    cold,
                    hot,
                    lag,
                    int(undecodable.get(topic, 0)),
                    rejected,
                )
            )
            partition_rows += [(topic, *p) for p in partitions]
        snapshot_rows = [
            row for topic in shown for row in history.get(topic, {}).get("snapshots", [])
        ]
        facts: dict[str, Any] = {
            "cluster": service.config.cluster,
            "catalog": service.catalog_url,
            "S3 gateway": service.s3_url,
            "Kafka": service.config.kafka_bootstrap,
            "lake": service.lake.catalog_uri if service.lake else "none (hotset only)",
            "topics": f"{len(topics)}"
            + (f" (first {MAX_TOPICS} shown)" if len(topics) > MAX_TOPICS else ""),
            "cache": f"{service.config.cache.type}, hit rate {_hit_rate()}",
            "index": service.config.index.type,
        }
        return [
            StatusSection(
                f"ISK {service.config.cluster}",
                facts,
                [
                    StatusTable(
                        "Topics",
                        (
                            "topic",
                            "mode",
                            "value codec",
                            "partitions",
                            "records in Kafka",
                            "cold offsets",
                            "hot offsets",
                            "lag",
                            "undecodable",
                            "rejected",
                        ),
                        topic_rows,
                        note="cold: offsets below the coldset boundary; hot: offsets Kafka holds "
                        "at or above it; lag: Kafka's high watermark minus the boundary; "
                        "undecodable: counted by this process since it started",
                    ),
                    StatusTable(
                        "Partitions",
                        (
                            "topic",
                            "partition",
                            "log start",
                            "boundary",
                            "high watermark",
                            "hot",
                            "lag",
                        ),
                        partition_rows,
                    ),
                    StatusTable(
                        "Coldset snapshots (latest first)",
                        (
                            "topic",
                            "committed (UTC)",
                            "snapshot id",
                            "operation",
                            "added records",
                            "total records",
                            "boundary",
                        ),
                        snapshot_rows,
                    ),
                ],
                self._charts(readable),
            )
        ]

    async def _readable(self, authorization: str | None) -> frozenset[str] | None:
        """The topics the request may see; None: all of them."""
        http = self.service.http
        catalog = http.catalog if http is not None else None
        if catalog is None:
            return None
        try:
            principal = catalog.authorize_header(authorization or "")
        except Exception as error:  # the catalog's 401
            raise StatusUnauthorized(str(error)) from None
        if principal is None or http is None or http.principals is None:
            return None
        return await http.principals.readable(principal)

    async def _topic(self, topic: str) -> tuple[str, str, list[tuple[Any, ...]]]:
        service = self.service
        config = service.context.config
        rule = mode_rule_for(config.tables, topic)
        mode = rule.mode.value if rule is not None else "append"
        codec_rule = rule_for(config.codecs, topic)
        codec = codec_rule.value if codec_rule is not None else "raw (bytes)"
        partitions: list[tuple[Any, ...]] = []
        offsets: dict[int, Any] = {}
        if service.reader is not None:
            with contextlib.suppress(Exception):
                offsets = await service.reader.offsets(topic)
        boundary: dict[int, int] | None = None
        if service.merged is not None:
            with contextlib.suppress(Exception):
                cold = await service.merged.coldset.snapshot(topic)
                boundary = dict(cold.boundary) if cold is not None else None
        for partition in sorted(offsets):
            part = offsets[partition]
            edge = boundary.get(partition, 0) if boundary is not None else None
            hot = part.high_watermark - max(edge or 0, part.log_start)
            lag = max(part.high_watermark - edge, 0) if edge is not None else None
            partitions.append(
                (partition, part.log_start, edge, part.high_watermark, max(hot, 0), lag)
            )
        return mode, codec, partitions

    def _lake_history(self, topics: list[str]) -> dict[str, dict[str, Any]]:
        """Per topic: its coldset table's latest snapshots and its rejected table's rows."""
        lake = self.service.lake
        if lake is None or not topics:
            return {}
        try:
            catalog = load_catalog(lake)
        except Exception:
            return {}
        out: dict[str, dict[str, Any]] = {}
        for topic in topics:
            entry: dict[str, Any] = {}
            with contextlib.suppress(Exception):
                table = catalog.load_table((lake.namespace, topic))
                snapshots = sorted(table.snapshots(), key=lambda s: s.timestamp_ms, reverse=True)
                entry["snapshots"] = [
                    (
                        topic,
                        time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(s.timestamp_ms / 1000)),
                        str(s.snapshot_id),
                        s.summary.operation.value if s.summary else "",
                        _int((s.summary or {}).get("added-records")),
                        _int((s.summary or {}).get("total-records")),
                        _boundary_text((s.summary or {}).get(BOUNDARY_PROPERTY)),
                    )
                    for s in snapshots[:SNAPSHOTS]
                ]
            with contextlib.suppress(Exception):
                rejected = catalog.load_table((lake.rejected_namespace, topic))
                current = rejected.current_snapshot()
                entry["rejected"] = (
                    _int(current.summary.get("total-records")) if current and current.summary else 0
                )
            out[topic] = entry
        return out

    def _charts(self, readable: frozenset[str] | None) -> list[StatusChart]:
        samples = [*self.samples, self.measure()]  # the charts end at the request
        by_topic: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
        for moment, lag, _ in samples:
            for topic, value in lag.items():
                if readable is None or topic in readable:
                    by_topic[topic].append((moment, value))
        biggest = sorted(by_topic, key=lambda t: by_topic[t][-1][1], reverse=True)[:CHART_SERIES]
        rate = [
            (later[0], max(later[2] - earlier[2], 0) / max(later[0] - earlier[0], 1e-9) * 60)
            for earlier, later in itertools.pairwise(samples)
        ]
        return [
            StatusChart("Pipeline lag, last hour", "offsets", {t: by_topic[t] for t in biggest}),
            StatusChart("Query rate, last hour", "LoadTable per minute", {"LoadTable": rate}),
        ]


def _samples(metric: Any) -> list[tuple[dict[str, str], float]]:
    return [
        (sample.labels, sample.value)
        for family in metric.collect()
        for sample in family.samples
        if not sample.name.endswith("_created")
    ]


def _undecodable() -> dict[str, float]:
    """Undecodable records of this process per topic (every component, key and value)."""
    counts: dict[str, float] = collections.defaultdict(float)
    for family in REGISTRY.collect():
        if family.name != "bergstream_undecodable_records":
            continue
        for sample in family.samples:
            if sample.name.endswith("_total"):
                counts[sample.labels.get("topic", "")] += sample.value
    return counts


def _hit_rate() -> str:
    hits = misses = 0.0
    for labels, value in _samples(CACHE_REQUESTS):
        if labels.get("result") == "hit":
            hits += value
        elif labels.get("result") == "miss":
            misses += value
    return f"{hits / (hits + misses):.0%}" if hits + misses else "no lookups yet"


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _boundary_text(value: Any) -> str:
    if not value:
        return "-"
    try:
        return " ".join(f"{p}:{o}" for p, o in sorted(parse_boundary(value).items()))
    except Exception:
        return str(value)
