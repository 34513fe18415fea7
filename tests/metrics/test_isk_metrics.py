"""``bergstream run`` with the ``isk`` service and the metrics endpoint, on the real stack:
scraped before and after PyIceberg loads and reads a hotset table, ISK's LoadTable and
synthesized bytes counters rise and the index lag of the topic is exported; a restarted gateway
serves from its cache backend, which the cache counters show; loading the merged table exports
the pipeline lag (Kafka's high watermark minus the coldset boundary the real pipeline wrote),
which grows with every record produced and not yet copied."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bergstream.devstack.stack.ports import free_ports
from tests.kits.ksi_stack import lake_yaml, run_pipeline_once
from tests.metrics.isk_config import isk_yaml
from tests.metrics.scrape import Samples, get_json, sample, scrape, total
from tests.support import ProxyProcess, start_bergstream_run

pytestmark = pytest.mark.slow

ISK_CLUSTER = "metrics-isk"
RECORDS = 50


def produce(bootstrap: str, topic: str, count: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
    for i in range(count):
        producer.produce(topic, key=f"k{i}".encode(), value=f"value {i}".encode(), partition=0)
    assert producer.flush(30) == 0


def has_sample(samples: Samples, name: str, **labels: str) -> bool:
    return any(
        found == name and all((k, v) in items for k, v in labels.items())
        for found, items in samples
    )


def isk_config(tmp_path: Path, kafka_bootstrap: str, extra: str = "") -> tuple[Path, int]:
    """A config running one ``isk`` service and the metrics endpoint; its catalog port."""
    catalog_port, s3_port = free_ports(2)
    config = tmp_path / "isk.yaml"
    config.write_text(
        isk_yaml(tmp_path, kafka_bootstrap, ISK_CLUSTER, catalog_port=catalog_port, s3_port=s3_port)
        + extra
    )
    return config, catalog_port


def start_isk(config: Path, tmp_path: Path) -> tuple[ProxyProcess, str]:
    """Run ``config``; the process and its metrics URL."""
    running = start_bergstream_run(
        config, "isk", {"BERGSTREAM_HOME": str(tmp_path / "home")}, "the isk service"
    )
    found = re.search(r"; metrics: (http://\S+)", running.log())
    if not found:
        running.stop()
        raise AssertionError(f"no metrics URL in the ready line:\n{running.log()}")
    return running, found.group(1)


def stop(running: ProxyProcess) -> None:
    code = running.stop()
    assert code == 0, running.log()


def test_scraped_isk_counters_rise_when_a_table_is_loaded_and_read(
    kafka_bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    from pyiceberg.catalog.rest import RestCatalog

    topic = new_topic(1, "isk-metrics")
    produce(kafka_bootstrap, topic, RECORDS)
    config, catalog_port = isk_config(tmp_path, kafka_bootstrap)
    uri = f"http://127.0.0.1:{catalog_port}"

    running, url = start_isk(config, tmp_path)
    try:
        status, ready = get_json(url.removesuffix("/metrics") + "/readyz")
        assert status == 200 and [c["name"] for c in ready["checks"]] == ["kafka"], ready
        before = scrape(url)
        rows = RestCatalog("isk", uri=uri).load_table(f"hotset.{topic}").scan().to_arrow()
        assert rows.num_rows == RECORDS
        after = scrape(url)
    finally:
        stop(running)

    def rise(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    isk = {"cluster": ISK_CLUSTER}
    assert rise("bergstream_isk_load_tables_total", namespace="hotset", **isk) >= 1
    assert rise("bergstream_isk_synthesized_bytes_total", kind="data", **isk) > 0
    assert rise("bergstream_isk_synthesized_bytes_total", **isk) > rise(
        "bergstream_isk_synthesized_bytes_total", kind="data", **isk
    )  # metadata, manifests and manifest lists too
    assert has_sample(after, "bergstream_isk_index_lag_offsets", topic=topic, **isk)

    # A restarted gateway has nothing in memory: what it serves comes from the cache backend.
    running, url = start_isk(config, tmp_path)
    try:
        before = scrape(url)
        rows = RestCatalog("isk", uri=uri).load_table(f"hotset.{topic}").scan().to_arrow()
        assert rows.num_rows == RECORDS
        after = scrape(url)
    finally:
        stop(running)
    assert rise("bergstream_cache_requests_total", backend="local") > 0
    assert rise("bergstream_cache_requests_total", backend="local", result="hit") > 0


def test_the_pipeline_lag_follows_kafka_and_the_boundary(
    kafka_bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    from pyiceberg.catalog.rest import RestCatalog

    topic = new_topic(1, "lag-metrics")
    produce(kafka_bootstrap, topic, RECORDS)
    config, catalog_port = isk_config(
        tmp_path, kafka_bootstrap, lake_yaml(tmp_path / "home", kafka_bootstrap)
    )
    summary = run_pipeline_once(config, topic)  # the coldset: offsets 0..RECORDS-1
    assert summary["records"] == RECORDS, summary
    lag = {"cluster": ISK_CLUSTER, "topic": topic, "partition": "0"}

    running, url = start_isk(config, tmp_path)
    try:
        catalog = RestCatalog("isk", uri=f"http://127.0.0.1:{catalog_port}")
        before = scrape(url)
        assert catalog.load_table(f"merged.{topic}").scan().to_arrow().num_rows == RECORDS
        copied = scrape(url)
        produce(kafka_bootstrap, topic, 7)  # in Kafka, not yet in the coldset
        assert catalog.load_table(f"merged.{topic}").scan().to_arrow().num_rows == RECORDS + 7
        behind = scrape(url)
    finally:
        stop(running)

    assert has_sample(copied, "bergstream_pipeline_lag_offsets", **lag)
    assert sample(copied, "bergstream_pipeline_lag_offsets", lag) == 0
    assert sample(behind, "bergstream_pipeline_lag_offsets", lag) == 7
    merged = {"cluster": ISK_CLUSTER, "namespace": "merged"}
    loads = total(behind, "bergstream_isk_load_tables_total", **merged)
    assert loads - total(before, "bergstream_isk_load_tables_total", **merged) >= 2


def test_the_background_indexer_keeps_the_pipeline_lag_current_without_queries(
    kafka_bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = new_topic(1, "lag-background")
    produce(kafka_bootstrap, topic, RECORDS)
    config, _catalog_port = isk_config(
        tmp_path, kafka_bootstrap, lake_yaml(tmp_path / "home", kafka_bootstrap)
    )
    text = config.read_text()
    assert "chunk_records: 16\n" in text
    config.write_text(
        text.replace(
            "chunk_records: 16\n", "chunk_records: 16\n      index_interval_seconds: 0.5\n"
        )
    )
    summary = run_pipeline_once(config, topic)
    assert summary["records"] == RECORDS, summary
    lag = {"cluster": ISK_CLUSTER, "topic": topic, "partition": "0"}
    running, url = start_isk(config, tmp_path)
    try:
        produce(kafka_bootstrap, topic, 5)  # no LoadTable at all from here on
        deadline = time.monotonic() + 180
        while not (
            has_sample(samples := scrape(url), "bergstream_pipeline_lag_offsets", **lag)
            and sample(samples, "bergstream_pipeline_lag_offsets", lag) == 5
        ):
            assert time.monotonic() < deadline, running.log()[-3000:]
            time.sleep(0.3)
        assert sample(samples, "bergstream_isk_index_lag_offsets", lag) < RECORDS + 5
    finally:
        stop(running)
