"""``bergstream run`` with the ``isk`` service and the metrics endpoint, on the real stack:
scraped before and after PyIceberg loads and reads a hotset table, ISK's LoadTable, synthesized
bytes and cache counters rise and the index lag of the topic is exported."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from bergstream.core.stack.ports import free_ports
from tests.metrics.scrape import Samples, scrape, total
from tests.support import start_bergstream_run

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


def test_scraped_isk_counters_rise_when_a_table_is_loaded_and_read(
    kafka_bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    from pyiceberg.catalog.rest import RestCatalog

    topic = new_topic(1, "isk-metrics")
    produce(kafka_bootstrap, topic, RECORDS)
    catalog_port, s3_port = free_ports(2)
    config = tmp_path / "isk.yaml"
    config.write_text(
        textwrap.dedent(
            f"""
            services:
              - type: isk
                config:
                  cluster: {ISK_CLUSTER}
                  kafka_bootstrap: "{kafka_bootstrap}"
                  chunk_records: 16
                  http:
                    catalog_port: {catalog_port}
                    s3_port: {s3_port}
                    access_key: isk-metrics
                    secret_key: isk-metrics-secret
                  index: {{type: sqlite, config: {{path: "{tmp_path / "index.sqlite"}"}}}}
                  cache: {{type: local, config: {{directory: "{tmp_path / "cache"}"}}}}
            metrics: {{port: 0}}
            """
        )
    )
    running = start_bergstream_run(
        config, kafka_bootstrap, {"BERGSTREAM_HOME": str(tmp_path / "home")}, "the isk service"
    )
    try:
        found = re.search(r"; metrics: (http://\S+)", running.log())
        assert found, running.log()
        url = found.group(1)
        before = scrape(url)
        catalog = RestCatalog("isk", uri=f"http://127.0.0.1:{catalog_port}")
        for _ in range(2):  # the second read finds sealed chunks in the cache
            rows = catalog.load_table(f"hotset.{topic}").scan().to_arrow()
            assert rows.num_rows == RECORDS
        after = scrape(url)
    finally:
        code = running.stop()
    assert code == 0, running.log()

    def rise(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    isk = {"cluster": ISK_CLUSTER}
    assert rise("bergstream_isk_load_tables_total", namespace="hotset", **isk) >= 2
    assert rise("bergstream_isk_synthesized_bytes_total", kind="data", **isk) > 0
    assert rise("bergstream_isk_synthesized_bytes_total", **isk) > rise(
        "bergstream_isk_synthesized_bytes_total", kind="data", **isk
    )  # metadata, manifests and manifest lists too
    assert rise("bergstream_cache_requests_total") > 0
    assert rise("bergstream_cache_requests_total", result="hit") > 0
    assert has_sample(after, "bergstream_isk_index_lag_offsets", topic=topic, **isk)
