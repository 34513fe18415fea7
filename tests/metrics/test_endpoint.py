"""The ``metrics:`` config section, the Prometheus endpoint and how ``bergstream run`` serves it."""

from __future__ import annotations

import asyncio
import importlib
import socket
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from bergstream.core.cli import cli
from bergstream.core.config import ConfigError, MetricsConfig, parse_config
from bergstream.core.metrics import PROXY_REQUESTS
from bergstream.core.metrics_http import MetricsServer, MetricsStartError
from bergstream.core.plugins import load_registry
from bergstream.core.runner import build_services, ready_line
from tests.metrics.scrape import parse_metrics, sample

CLUSTER = """
virtual_clusters:
  - name: demo
    target: {bootstrap: "127.0.0.1:9"}
    gateway: {port: 19092}
"""


def problems_of(text: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, source="m.yaml")
    return [str(problem) for problem in caught.value.problems]


def test_the_section_is_optional_and_has_defaults() -> None:
    assert parse_config(CLUSTER).metrics is None
    config = parse_config("metrics: {}\n")
    assert config.metrics == MetricsConfig(enabled=True, host="127.0.0.1", port=9464)
    assert config.metrics.url() == "http://127.0.0.1:9464/metrics"
    assert parse_config("metrics:\n").metrics == config.metrics  # a bare key turns it on
    assert parse_config("metrics: {host: '::1', port: 0}").metrics.url(81) == (
        "http://[::1]:81/metrics"
    )
    assert parse_config("metrics: {host: metrics.example.com}").metrics.host == (
        "metrics.example.com"
    )


@pytest.mark.parametrize(
    ("section", "path", "words"),
    [
        ("{port: 70000}", "metrics.port", "less than or equal to 65535"),
        ("{port: -1}", "metrics.port", "greater than or equal to 0"),
        ("{port: http}", "metrics.port", "valid integer"),
        ("{host: 'not a host'}", "metrics.host", "is not an IP address or host name"),
        ("{host: ''}", "metrics.host", "is not an IP address or host name"),
        ("{host: 'a_b..c'}", "metrics.host", "is not an IP address or host name"),
        ("{prot: 9464}", "metrics.prot", "unknown key"),
        ("{enabled: maybe}", "metrics.enabled", "valid boolean"),
        ("8080", "metrics", "expected a mapping of keys here, got int 8080"),
    ],
)
def test_bad_values_are_clear_config_errors(section: str, path: str, words: str) -> None:
    (problem,) = problems_of(f"metrics: {section}\n")
    assert problem.startswith(f"m.yaml:1: {path}: "), problem
    assert words in problem


def test_logging_section_defaults_and_errors() -> None:
    config = parse_config(CLUSTER)
    assert (config.logging.format, config.logging.level) == ("text", "info")
    assert parse_config("logging: {format: json, level: debug}").logging.format == "json"
    (problem,) = problems_of("logging: {format: xml}\n")
    assert "logging.format" in problem and "'text' or 'json'" in problem


def test_run_serves_the_endpoint_only_when_enabled() -> None:
    registry = load_registry()
    assert [s.name for s in build_services(parse_config(CLUSTER), registry)] == ["proxy:demo"]
    on = build_services(parse_config(CLUSTER + "metrics: {port: 9999}\n"), registry)
    assert [s.name for s in on] == ["metrics", "proxy:demo"]  # first up, last down
    assert ready_line(on) == (
        "bergstream: ready: proxy:demo; metrics: http://127.0.0.1:9999/metrics"
    )
    off = parse_config(CLUSTER + "metrics: {enabled: false}\n")
    assert [s.name for s in build_services(off, registry)] == ["proxy:demo"]


def fetch(url: str) -> tuple[str, str]:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.headers["Content-Type"], response.read().decode()


def port_is_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


async def test_the_endpoint_serves_current_values_and_releases_its_port() -> None:
    # The families a running ISK and KSI define (each plugin's metrics module, as it imports).
    importlib.import_module("bergstream.plugins.isk_gateway.metrics")
    importlib.import_module("bergstream.plugins.ksi_fetch_filter.metrics")
    server = MetricsServer(MetricsConfig(port=0))
    await server.start()
    try:
        assert server.port != 0 and server.url == f"http://127.0.0.1:{server.port}/metrics"
        labels = {"virtual_cluster": "endpoint-test", "api_key": "Metadata"}
        PROXY_REQUESTS.labels(**labels).inc(3)
        content_type, text = await asyncio.to_thread(fetch, server.url)
        assert content_type.startswith("text/plain")
        assert sample(parse_metrics(text), "bergstream_proxy_requests_total", labels) == 3
        PROXY_REQUESTS.labels(**labels).inc()
        _, text = await asyncio.to_thread(fetch, server.url)
        assert sample(parse_metrics(text), "bergstream_proxy_requests_total", labels) == 4
        for family, kind in (
            ("bergstream_proxy_bytes_total", "counter"),
            ("bergstream_ksi_cold_fetches_total", "counter"),
            ("bergstream_ksi_cold_records_total", "counter"),
            ("bergstream_isk_load_tables_total", "counter"),
            ("bergstream_isk_synthesized_bytes_total", "counter"),
            ("bergstream_cache_requests_total", "counter"),
            ("bergstream_isk_index_lag_offsets", "gauge"),
            ("bergstream_pipeline_lag_offsets", "gauge"),
        ):
            assert f"# TYPE {family} {kind}\n" in text, family
    finally:
        await server.stop()
    assert port_is_free(server.port)
    await server.stop()  # twice is harmless


async def test_a_taken_port_is_a_clear_start_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = MetricsServer(MetricsConfig(port=port))
        with pytest.raises(MetricsStartError) as caught:
            await server.start()
    assert str(caught.value).startswith(f"metrics: cannot listen on 127.0.0.1:{port}: ")
    assert "metrics.port" in str(caught.value)


def test_bergstream_run_reports_a_taken_metrics_port_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = tmp_path / "run.yaml"
        config.write_text(CLUSTER + f"metrics: {{port: {port}}}\n")
        result = CliRunner().invoke(cli, ["run", "-c", str(config)])
    assert result.exit_code == 1
    assert f"cannot start: metrics: cannot listen on 127.0.0.1:{port}" in result.output
    assert "Traceback" not in result.output


def test_config_check_reports_a_bad_port_with_its_line(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(CLUSTER + "metrics:\n  port: 123456\n")
    result = CliRunner().invoke(cli, ["config", "check", str(config)])
    assert result.exit_code == 1
    assert f"{config}:7: metrics.port: Input should be less than or equal to 65535" in (
        result.output
    )
