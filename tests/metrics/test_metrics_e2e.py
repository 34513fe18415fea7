"""``bergstream run`` with a ksi virtual cluster and the metrics endpoint, on the real stack:
scraped before and after real clients produce and consume through it, the proxy's request and
byte counters and KSI's cold counters rise by what flowed; the logs are JSON lines naming the
component and the client."""

from __future__ import annotations

import json
import re
import socket
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from bergstream.core.records import Record
from bergstream.devstack.stack.ports import free_port_block
from tests.kits.coldset_tables import make_lake, write_cold
from tests.kits.ksi_stack import delete_records_below, lake_yaml, make_records, produce
from tests.metrics.scrape import get_json, scrape, total
from tests.support import start_bergstream_run, wait_until

pytestmark = pytest.mark.slow

PARTITIONS = 2
RECORDS = 400
COLD_BELOW = 150  # per partition: offsets below it are in the coldset and deleted in Kafka
CLUSTER = "metrics-e2e"


def consume_all(bootstrap: str, topic: str, count: int) -> list[tuple[int, int]]:
    """(partition, offset) of the first ``count`` records, read from the beginning."""
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"{topic}-metrics",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "client.id": "metrics-e2e-consumer",
        }
    )
    consumer.subscribe([topic])
    got: list[tuple[int, int]] = []
    deadline = time.monotonic() + 120
    try:
        while len(got) < count and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is None:
                continue
            assert message.error() is None, message.error()
            got.append((message.partition(), message.offset()))
    finally:
        consumer.close()
    return got


def test_scraped_counters_rise_with_proxy_and_cold_traffic(
    kafka_bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = new_topic(
        PARTITIONS, "metrics", **{"message.timestamp.after.max.ms": "9223372036854775807"}
    )
    seen = produce(kafka_bootstrap, topic, make_records(RECORDS, PARTITIONS))
    cold = [
        (partition, 0, Record(offset, timestamp, key, value, headers))
        for partition, offset, timestamp, key, value, headers in seen
        if offset < COLD_BELOW
    ]
    write_cold(make_lake(tmp_path), topic, cold, dict.fromkeys(range(PARTITIONS), COLD_BELOW))
    delete_records_below(kafka_bootstrap, topic, PARTITIONS, COLD_BELOW)

    port = free_port_block(4)
    config = tmp_path / "run.yaml"
    config.write_text(
        textwrap.dedent(
            f"""
            virtual_clusters:
              - name: {CLUSTER}
                target: {{bootstrap: "{kafka_bootstrap}"}}
                gateway: {{host: 127.0.0.1, port: {port}, lowest_broker_id: 0, broker_count: 3}}
                filters:
                  - type: ksi
                    config: {{topics: ["{topic}"]}}
            metrics: {{host: 127.0.0.1, port: 0}}
            logging: {{format: json}}
            """
        )
        + lake_yaml(tmp_path, kafka_bootstrap)
    )
    bootstrap = f"127.0.0.1:{port}"
    proxy = start_bergstream_run(config, bootstrap, what="the proxy")
    try:
        found = re.search(r"bergstream: ready: proxy:\S+; metrics: (http://\S+)", proxy.log())
        assert found, proxy.log()
        url = found.group(1)
        base = url.removesuffix("/metrics")
        assert get_json(f"{base}/healthz")[0] == 200
        status, ready = get_json(f"{base}/readyz")
        assert status == 200, ready  # the target cluster, and the lake the ksi filter reads
        assert [(c["name"], c["ok"]) for c in ready["checks"]] == [
            ("kafka", True),
            ("catalog", True),
        ]
        before = scrape(url)

        got = consume_all(bootstrap, topic, RECORDS)
        assert sorted(got) == sorted((p, o) for p, o, *_ in seen)
        produce(bootstrap, topic, make_records(20, PARTITIONS, start=RECORDS))
        # The proxy publishes its counts once a second: scrape until the produce shows.
        produced = {"virtual_cluster": CLUSTER, "api_key": "Produce"}
        wait_until(lambda: total(scrape(url), "bergstream_proxy_requests_total", **produced) > 0)
        after = scrape(url)
    finally:
        code = proxy.stop()
    assert code == 0, proxy.log()

    def rise(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    vc = {"virtual_cluster": CLUSTER}
    for api in ("Fetch", "Produce", "Metadata", "ApiVersions", "ListOffsets"):
        assert rise("bergstream_proxy_requests_total", api_key=api, **vc) >= 1, api
        for direction in ("request", "response"):
            grown = rise("bergstream_proxy_bytes_total", api_key=api, direction=direction, **vc)
            assert grown > 0, (api, direction)
    cold_records = len(cold)
    # Every cold record reached the client inside a Fetch response.
    fetched = rise("bergstream_proxy_bytes_total", api_key="Fetch", direction="response", **vc)
    assert fetched > cold_records * 60
    assert rise("bergstream_ksi_cold_fetches_total", topic=topic, **vc) >= PARTITIONS
    assert rise("bergstream_ksi_cold_records_total", topic=topic, **vc) >= cold_records

    lines = [json.loads(line) for line in proxy.log().splitlines() if line.startswith("{")]
    assert lines, proxy.log()
    assert all({"ts", "level", "component", "client", "message"} <= line.keys() for line in lines)
    clients = [
        line
        for line in lines
        if line["component"] == "proxy" and re.fullmatch(r"127\.0\.0\.1:\d+", line["client"])
    ]
    assert clients, "no proxy line names its client"
    assert any(line.get("client_id") == "metrics-e2e-consumer" for line in clients)

    host, port_text = url.removeprefix("http://").split("/")[0].rsplit(":", 1)
    with socket.socket() as probe, pytest.raises(OSError):
        probe.settimeout(5)
        probe.connect((host, int(port_text)))  # the endpoint stopped with the run
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=5)
