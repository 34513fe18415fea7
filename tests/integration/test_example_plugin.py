"""The third-party example plugin: installed as its own distribution, discovered through the
entry point, configured, and run in the proxy, where a consumer sees its effect."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer

from tests.support import REPO

pytestmark = pytest.mark.slow

BERGSTREAM = str(Path(sys.executable).parent / "bergstream")
FILTERS = '[{type: add-header, config: {header: x-proxied-by, value: "bergstream example"}}]'


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The example plugin pip-installed into a directory of its own (not into the venv)."""
    target = tmp_path_factory.mktemp("plugin-site")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(target),
            str(REPO / "examples" / "plugin-example"),
        ],
        check=True,
        timeout=300,
    )
    return str(target)


def _env(plugin_path: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": plugin_path}


def test_plugin_is_discovered(plugin_path):
    out = subprocess.run(
        [BERGSTREAM, "plugins", "--json"],
        env=_env(plugin_path),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    plugins = {p["name"]: p for p in json.loads(out)}
    # One distribution, one plugin (entry point) per capability.
    add_header, sqlite_cache = plugins["example_add_header"], plugins["example_sqlite_cache"]
    for example in (add_header, sqlite_cache):
        assert example["distribution"] == "bergstream-example-plugin"
        assert example["version"] == "0.1.0"
    assert add_header["registers"] == [{"kind": "filter", "name": "add-header"}]
    assert add_header["hooks"] == ["register_filters"]
    assert sqlite_cache["registers"] == [{"kind": "cache backend", "name": "example-sqlite"}]
    assert sqlite_cache["hooks"] == ["register_cache_backends"]

    without = subprocess.run(
        [BERGSTREAM, "plugins", "--json"], capture_output=True, text=True, check=True
    ).stdout
    assert not {p["name"] for p in json.loads(without)} & {
        "example_add_header",
        "example_sqlite_cache",
    }


def test_plugin_config_is_validated(plugin_path, tmp_path):
    config = tmp_path / "c.yaml"
    base = (
        "virtual_clusters:\n  - name: c\n    target: {bootstrap: '127.0.0.1:9092'}\n"
        "    gateway: {port: 30000}\n    filters: "
    )
    config.write_text(base + FILTERS + "\n")
    ok = subprocess.run(
        [BERGSTREAM, "config", "check", str(config)],
        env=_env(plugin_path),
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0, ok.stderr

    config.write_text(base + "[{type: add-header, config: {colour: red}}]\n")
    bad = subprocess.run(
        [BERGSTREAM, "config", "check", str(config)],
        env=_env(plugin_path),
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 1
    assert "virtual_clusters[0].filters[0].config.value: required key is missing" in bad.stderr
    assert "virtual_clusters[0].filters[0].config.colour: unknown key" in bad.stderr

    missing = subprocess.run(
        [BERGSTREAM, "config", "check", str(config)], capture_output=True, text=True
    )
    assert missing.returncode == 1
    assert "no filter plugin named 'add-header' is installed" in missing.stderr


def test_plugin_filter_runs_in_the_proxy(plugin_path, run_proxy, new_topic, kafka_bootstrap):
    proxy = run_proxy(FILTERS, env={"PYTHONPATH": plugin_path})
    topic = new_topic(partitions=2)
    producer = Producer({"bootstrap.servers": proxy.bootstrap, "enable.idempotence": True})
    for i in range(500):
        producer.produce(
            topic,
            key=str(i).encode(),
            value=b"v%d" % i,
            headers=[("original", b"kept")] if i % 2 else None,
        )
    assert producer.flush(30) == 0

    # Read straight from Kafka: the header was added in flight and stored by the broker.
    consumer = Consumer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "group.id": uuid.uuid4().hex,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    got = {}
    try:
        _deadline = time.monotonic() + 120
        while len(got) < 500:
            assert time.monotonic() < _deadline, "records did not all arrive within 120 s"
            message = consumer.poll(5)
            if message is not None and message.error() is None:
                got[int(message.key())] = message.headers()
    finally:
        consumer.close()
    for i, headers in got.items():
        expected = [("original", b"kept")] if i % 2 else []
        assert headers == [*expected, ("x-proxied-by", b"bergstream example")]


def test_large_requests_and_responses_pass_a_filtered_chain(plugin_path, run_proxy, new_topic):
    """Produce requests and Fetch responses of several MB (larger than the proxy's backlog
    bound) through a chain that decodes Produce and Fetch: nothing stalls, nothing is lost."""
    proxy = run_proxy(FILTERS, env={"PYTHONPATH": plugin_path})
    topic = new_topic(partitions=6)
    count, value = 30_000, bytes(range(256)) * 4  # 1 KB values, ~30 MB in all
    producer = Producer(
        {
            "bootstrap.servers": proxy.bootstrap,
            "linger.ms": 200,
            "batch.size": 1_000_000,
            "message.max.bytes": 20_000_000,
            "queue.buffering.max.kbytes": 200_000,
        }
    )
    for i in range(count):
        producer.produce(topic, key=b"%d" % i, value=value, partition=i % 6)
        producer.poll(0)
    assert producer.flush(120) == 0

    consumer = Consumer(
        {
            "bootstrap.servers": proxy.bootstrap,
            "group.id": uuid.uuid4().hex,
            "auto.offset.reset": "earliest",
            "fetch.max.bytes": 50_000_000,
            "max.partition.fetch.bytes": 8_000_000,
        }
    )
    consumer.subscribe([topic])
    seen = set()
    deadline = time.monotonic() + 120
    try:
        while len(seen) < count and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=1000, timeout=1):
                assert message.error() is None, message.error()
                assert message.value() == value
                assert message.headers() == [("x-proxied-by", b"bergstream example")]
                seen.add(int(message.key()))
    finally:
        consumer.close()
    assert len(seen) == count
