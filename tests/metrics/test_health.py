"""``/healthz`` and ``/readyz`` on a process's metrics endpoint, and the probes behind readiness,
each against a real socket or HTTP server on 127.0.0.1 (no Kafka needed: a closed port is what a
stopped broker looks like)."""

from __future__ import annotations

import asyncio
import http.server
import socket
import sqlite3
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bergstream.core.config import MetricsConfig, parse_config
from bergstream.core.health import (
    ProbeFailed,
    ReadinessCheck,
    check_results,
    http_probe,
    kafka_probe,
    sqlite_probe,
    tcp_probe,
)
from bergstream.core.lake import LakeConfig, resolve_lake
from bergstream.core.metrics_http import MetricsServer
from bergstream.core.plugins import load_registry
from bergstream.core.readiness import lake_checks, registry_check
from bergstream.core.runner import build_services
from bergstream.core.typed.schema_registry import SchemaRegistrySettings
from tests.metrics.scrape import get_json, parse_metrics


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def listening() -> Iterator[int]:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield int(server.getsockname()[1])


class _Answer(http.server.BaseHTTPRequestHandler):
    """Answers GET with the status the path names (``/401/...``) and records the headers."""

    seen: list[dict[str, str]] = []

    def do_GET(self) -> None:
        _Answer.seen.append(dict(self.headers))
        status = int(self.path.split("/")[1])
        self.send_response(status)
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def http_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def test_tcp_and_kafka_probes(listening: int) -> None:
    tcp_probe("127.0.0.1", listening)(1.0)
    with pytest.raises(OSError):
        tcp_probe("127.0.0.1", closed_port())(1.0)
    dead = closed_port()
    kafka_probe(f"127.0.0.1:{dead},127.0.0.1:{listening}")(1.0)  # one broker answering is enough
    with pytest.raises(ProbeFailed, match=rf"no broker answers \(127.0.0.1:{dead}: "):
        kafka_probe(f"127.0.0.1:{dead}")(1.0)


def test_http_probe(http_server: str) -> None:
    http_probe(f"{http_server}/200/v1/config", headers={"Authorization": "Bearer t"})(1.0)
    assert _Answer.seen[-1]["Authorization"] == "Bearer t"
    with pytest.raises(ProbeFailed, match="answered HTTP 401 \\(credentials refused\\)"):
        http_probe(f"{http_server}/401/x")(1.0)
    with pytest.raises(ProbeFailed, match="answered HTTP 503 \\(error\\)"):
        http_probe(f"{http_server}/503/x")(1.0)
    with pytest.raises(ProbeFailed, match="Connection refused"):
        http_probe(f"http://127.0.0.1:{closed_port()}/")(1.0)


def test_sqlite_probe(tmp_path: Path) -> None:
    with pytest.raises(ProbeFailed, match="does not exist"):
        sqlite_probe(tmp_path / "catalog.db")(1.0)
    sqlite3.connect(tmp_path / "catalog.db").close()
    sqlite_probe(tmp_path / "catalog.db")(1.0)


def test_checks_run_at_once_and_a_slow_one_times_out(listening: int) -> None:
    def slow(timeout: float) -> None:
        time.sleep(5)

    began = time.monotonic()
    results = check_results(
        [
            ReadinessCheck("kafka", f"127.0.0.1:{listening}", tcp_probe("127.0.0.1", listening)),
            ReadinessCheck("slow", "nowhere", slow),
            ReadinessCheck("slow2", "nowhere", slow),
        ],
        timeout=0.5,
    )
    assert time.monotonic() - began < 4.5  # in parallel: not 2 x 5 s
    assert [(r["name"], r["ok"]) for r in results] == [
        ("kafka", True),
        ("slow", False),
        ("slow2", False),
    ]
    assert results[1]["error"] == "no answer in 0.5 s"


def test_the_checks_of_a_lake_and_a_registry(tmp_path: Path, http_server: str) -> None:
    lake = resolve_lake(LakeConfig(kafka_bootstrap="127.0.0.1:9092"), home=tmp_path)
    (sqlite,) = lake_checks(lake)
    assert (sqlite.name, sqlite.target) == ("catalog", str(lake.sqlite_path))
    rest = resolve_lake(
        LakeConfig.model_validate(
            {
                "kafka_bootstrap": "127.0.0.1:9092",
                "catalog": {
                    "type": "rest",
                    "uri": f"{http_server}/200",
                    "warehouse": "s3://lake/w",
                    "properties": {"token": "tok"},
                },
                "s3": {"endpoint": "http://127.0.0.1:1", "access_key": "a", "secret_key": "b"},
            }
        ),
        home=tmp_path,
    )
    catalog, s3 = lake_checks(rest)
    assert catalog.target == f"{http_server}/200/v1/config"
    catalog.probe(1.0)
    assert _Answer.seen[-1]["Authorization"] == "Bearer tok"
    assert (s3.name, s3.target) == ("s3", "http://127.0.0.1:1 bucket lake")
    with pytest.raises(ProbeFailed):
        s3.probe(1.0)
    registry = registry_check(
        SchemaRegistrySettings(url=f"{http_server}/401", username="u", password="p")
    )
    assert registry.target == f"{http_server}/401"
    with pytest.raises(ProbeFailed, match="credentials refused"):
        registry.probe(1.0)
    assert _Answer.seen[-1]["Authorization"] == "Basic dTpw"


async def test_healthz_readyz_and_pages(listening: int) -> None:
    server = MetricsServer(MetricsConfig(port=0))
    dead = closed_port()
    server.add_checks([ReadinessCheck("kafka", "k", tcp_probe("127.0.0.1", listening))])
    server.add_page(
        "/extra", lambda query: ("text/html; charset=utf-8", f"<p>{query}</p>".encode())
    )
    await server.start()
    base = f"http://127.0.0.1:{server.port}"
    try:
        status, body = await asyncio.to_thread(get_json, f"{base}/healthz")
        assert status == 200 and body["status"] == "up" and body["uptime_seconds"] >= 0
        status, body = await asyncio.to_thread(get_json, f"{base}/readyz")
        assert status == 503 and body["failing"] == ["starting"] and body["checks"][0]["ok"]
        server.mark_ready()
        status, body = await asyncio.to_thread(get_json, f"{base}/readyz")
        assert status == 200 and body == {"ready": True, "failing": [], "checks": body["checks"]}
        server.add_checks([ReadinessCheck("catalog", "c", tcp_probe("127.0.0.1", dead))])
        status, body = await asyncio.to_thread(get_json, f"{base}/readyz")
        assert status == 503 and body["failing"] == ["catalog"]
        assert "Connection refused" in body["checks"][1]["error"]
        page = await asyncio.to_thread(lambda: urllib.request.urlopen(f"{base}/extra?a=1").read())
        assert page == b"<p>a=1</p>"
        status, body = await asyncio.to_thread(get_json, f"{base}/nope")
        assert status == 404
        assert body["pages"] == ["/", "/status.json", "/metrics", "/healthz", "/readyz", "/extra"]
        metrics = await asyncio.to_thread(lambda: urllib.request.urlopen(f"{base}/metrics").read())
        assert b"# TYPE process_cpu_seconds_total counter" in metrics
        samples = parse_metrics(metrics.decode())
        assert samples[("bergstream_ready", ())] == 0  # the catalog does not answer
        up = "bergstream_dependency_up"
        assert samples[(up, (("dependency", "kafka"), ("target", "k")))] == 1
        assert samples[(up, (("dependency", "catalog"), ("target", "c")))] == 0
    finally:
        await server.stop()


def test_a_scrape_and_a_probe_together_probe_each_dependency_once() -> None:
    server = MetricsServer(MetricsConfig(port=0))
    calls: list[float] = []
    server.add_checks([ReadinessCheck("kafka", "k", calls.append)])
    server.mark_ready()
    assert server.readiness()[0] and server.readiness()[0]
    assert len(calls) == 1  # the second reuses the first's results
    server.add_checks([ReadinessCheck("catalog", "c", calls.append)])
    assert server.readiness()[1]["checks"][1]["name"] == "catalog"  # new checks: probed anew
    assert len(calls) == 3


def test_run_gives_the_endpoint_each_services_checks(tmp_path: Path) -> None:
    config = parse_config(
        f"""
virtual_clusters:
  - name: a
    target: {{bootstrap: "127.0.0.1:{closed_port()}"}}
    gateway: {{port: {closed_port()}}}
    filters: [{{type: ksi}}]
lake:
  kafka_bootstrap: "127.0.0.1:9092"
  catalog: {{uri: "sqlite:///{tmp_path}/c.db", warehouse: "{tmp_path}/w"}}
metrics: {{port: 0}}
""",
        registry=load_registry(),
    )
    metrics, _ = build_services(config, load_registry())
    assert isinstance(metrics, MetricsServer)
    ready, body = metrics.readiness()
    assert not ready
    assert [(c["name"], c["ok"]) for c in body["checks"]] == [("kafka", False), ("catalog", False)]
    assert body["failing"] == ["starting", "kafka", "catalog"]
