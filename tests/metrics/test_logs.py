"""Structured logs: component and client on every line, in text and in JSON."""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from bergstream.core.cli import cli
from bergstream.core.logs import component_log, component_of, configure_logging, make_handler
from bergstream.core.plugins import load_registry
from bergstream.core.proxy.log import ProxyLogAdapter


@pytest.fixture
def restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)


Capture = Callable[[str, str], tuple[logging.Logger, io.StringIO]]


@pytest.fixture
def capture() -> Iterator[Capture]:
    """Send one logger's records to a string in a format; the logger is restored afterwards."""
    saved: list[tuple[logging.Logger, list[logging.Handler], bool, int]] = []

    def start(fmt: str, name: str) -> tuple[logging.Logger, io.StringIO]:
        stream = io.StringIO()
        logger = logging.getLogger(name)
        saved.append((logger, list(logger.handlers), logger.propagate, logger.level))
        logger.handlers = [make_handler(fmt, stream)]  # type: ignore[arg-type]
        logger.propagate = False
        logger.setLevel(logging.DEBUG)
        return logger, stream

    yield start
    for logger, handlers, propagate, level in saved:
        logger.handlers, logger.propagate = handlers, propagate
        logger.setLevel(level)


@pytest.mark.parametrize(
    ("logger", "component"),
    [
        ("bergstream.proxy", "proxy"),
        ("bergstream.plugins.ksi_fetch_filter.store", "ksi"),
        ("bergstream.isk", "isk"),
        ("bergstream.isk.cache", "cache"),
        ("bergstream.isk.index", "index"),
        ("bergstream.isk.catalog", "isk"),
        ("bergstream.plugins.isk_gateway.http.catalog", "isk"),
        ("bergstream.pipeline.stream", "pipeline"),
        ("py4j.java_gateway", "pipeline"),
        ("bergstream.plugins.cache_backends.local_disk", "cache"),
        ("bergstream.plugins.index_backends.sqlite", "index"),
        ("bergstream.metrics", "metrics"),
        ("bergstream.runner", "runner"),
        ("bergstream.devstack.stack.kafka", "stack"),
        ("bergstream.plugins.someone_else", "someone_else"),
        ("thirdparty.module", "thirdparty.module"),
    ],
)
def test_components_follow_the_logger_name(logger: str, component: str) -> None:
    load_registry()  # the plugins register their loggers' components
    assert component_of(logger) == component


def test_json_lines_carry_component_client_and_extras(capture: Capture) -> None:
    logger, stream = capture("json", "bergstream.isk.capture")
    logger.info("loaded %s", "hotset.orders", extra={"client": "10.0.0.7:5123", "table": "x"})
    try:
        raise ValueError("broken file")
    except ValueError:
        logger.exception("synthesis failed")
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["component"] == "isk" and first["client"] == "10.0.0.7:5123"
    assert first["message"] == "loaded hotset.orders" and first["level"] == "INFO"
    assert first["table"] == "x" and first["logger"] == "bergstream.isk.capture"
    assert first["ts"].endswith("+00:00")
    assert second["client"] == "-" and "ValueError: broken file" in second["exception"]


def test_proxy_and_filter_lines_name_the_cluster_and_client(capture: Capture) -> None:
    _, stream = capture("json", "bergstream.proxy")
    connection_log = ProxyLogAdapter("orders-vc", "127.0.0.1:40001", "billing")
    connection_log.warning("closing connection: %s", "bye")
    component_log(connection_log, "ksi").warning("ksi: coldset failed for t-0: gone")
    proxy_line, ksi_line = (json.loads(line) for line in stream.getvalue().splitlines())
    for line in (proxy_line, ksi_line):
        assert line["virtual_cluster"] == "orders-vc"
        assert line["client"] == "127.0.0.1:40001" and line["client_id"] == "billing"
    assert proxy_line["component"] == "proxy" and ksi_line["component"] == "ksi"
    assert ksi_line["message"] == (
        "[orders-vc 127.0.0.1:40001 billing] ksi: coldset failed for t-0: gone"
    )


def test_text_lines_name_component_and_client(capture: Capture) -> None:
    logger, stream = capture("text", "bergstream.plugins.isk_gateway.http.s3")
    logger.warning("bad signature", extra={"client": "10.1.1.1:80"})
    _, proxy_stream = capture("text", "bergstream.proxy")
    ProxyLogAdapter("vc", "127.0.0.1:9").info("client connected")
    line = stream.getvalue().strip()
    assert line.endswith(" WARNING isk [10.1.1.1:80] bad signature"), line
    proxy_line = proxy_stream.getvalue().strip()
    assert proxy_line.endswith(" INFO proxy [vc 127.0.0.1:9] client connected"), proxy_line


def test_configure_logging_replaces_its_handler_and_follows_stderr(restore_root: None) -> None:
    configure_logging(logging.INFO, "json")
    configure_logging(logging.INFO, "json")
    root = logging.getLogger()
    assert [h.get_name() for h in root.handlers].count("bergstream") == 1
    saved, sys.stderr = sys.stderr, io.StringIO()
    try:
        logging.getLogger("bergstream.runner").info("started %s", "proxy:x")
        written = sys.stderr.getvalue()
    finally:
        sys.stderr = saved
    assert json.loads(written.splitlines()[-1])["component"] == "runner"
    with pytest.raises(ValueError, match="unknown log format 'xml'"):
        make_handler("xml")  # type: ignore[arg-type]


def test_the_log_format_is_chosen_on_the_command_line_or_in_the_config(
    tmp_path: Path, restore_root: None
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("logging: {format: xml}\n")
    result = CliRunner().invoke(cli, ["config", "check", str(config)])
    assert result.exit_code == 1 and "logging.format" in result.output
    result = CliRunner().invoke(cli, ["--log-format", "yaml", "plugins"])
    assert result.exit_code == 2 and "'text', 'json'" in result.output
    result = CliRunner(env={"BERGSTREAM_LOG_FORMAT": "json"}).invoke(cli, ["plugins"])
    assert result.exit_code == 0
    handler = next(h for h in logging.getLogger().handlers if h.get_name() == "bergstream")
    assert type(handler.formatter).__name__ == "JsonFormatter"


def verbose_lines(lines: list[tuple[str, int, str]], trace_clients: bool = False) -> str:
    """What ``-v`` (or ``-vv``: ``trace_clients``) writes of ``lines`` (logger, level,
    message); the libraries' levels restored afterwards."""
    libraries = {name: logging.getLogger(name).level for name in ("numba", "aiokafka")}
    stream = io.StringIO()
    try:
        configure_logging(logging.DEBUG, "text", stream, trace_clients=trace_clients)
        for logger, level, message in lines:
            logging.getLogger(logger).log(level, message)
    finally:
        for name, level in libraries.items():
            logging.getLogger(name).setLevel(level)
    return stream.getvalue()


@pytest.mark.parametrize("trace_clients", [False, True])
def test_the_kafka_clients_wire_trace_needs_vv(restore_root: None, trace_clients: bool) -> None:
    """``-v`` shows bergstream's debug lines and the Kafka client's INFO and above; ``-vv``
    (``trace_clients``) adds the client's every request and response."""
    written = verbose_lines(
        [
            ("aiokafka.conn", logging.DEBUG, "Request to 127.0.0.1:9092 7: MetadataRequest"),
            ("aiokafka.conn", logging.INFO, "connection lost"),
            ("bergstream.runner", logging.DEBUG, "starting isk"),
        ],
        trace_clients,
    )
    assert "starting isk" in written and "connection lost" in written
    assert ("MetadataRequest" in written) is trace_clients


def test_verbose_logging_keeps_numba_compiler_passes_out(restore_root: None) -> None:
    """``-v`` shows bergstream's debug lines, not numba's IR dumps."""
    written = verbose_lines(
        [
            ("numba.core.ssa", logging.DEBUG, "on stmt: $x = arg(0)"),
            ("bergstream.runner", logging.DEBUG, "starting isk"),
            ("numba.core.caching", logging.INFO, "cache hit"),
        ]
    )
    assert "starting isk" in written and "cache hit" in written
    assert "on stmt" not in written
