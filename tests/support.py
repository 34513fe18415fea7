"""Helpers shared by the tests (fixtures live in conftest.py)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bergstream.core.records import Record
from bergstream.core.typed.row_contract import record_to_row

REPO = Path(__file__).resolve().parent.parent

#: KIP-368 session lifetime the secured stack's brokers grant (the ``secure_stack`` fixture of
#: tests/conftest.py): short, so clients that stay connected through bergstream re-authenticate
#: during the tests.
SECURE_REAUTH_MS = 20_000
#: The SASL mechanisms the secured stack's principals log in with, SCRAM the default login.
SECURE_MECHANISMS = ("scram-sha-512", "oauthbearer", "gssapi")

#: What the ``cdc_stack_env`` fixture of tests/conftest.py starts: Kafka Connect with Debezium
#: reading PostgreSQL, with the registry for Avro and S3 beside them.
CDC_COMPONENTS = frozenset({"kafka", "s3", "schema-registry", "postgres", "connect"})


@dataclass
class ProxyProcess:
    """A ``bergstream run`` process serving one virtual cluster."""

    process: subprocess.Popen[str]
    bootstrap: str
    config_path: Path
    stderr_lines: list[str] = field(default_factory=list)

    def stop(self, timeout: float = 20) -> int:
        """SIGTERM the process and return its exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def log(self) -> str:
        """Everything the process wrote to stderr so far."""
        return "".join(self.stderr_lines)


def pump_stderr(stream, lines: list[str], ready: threading.Event) -> None:
    for line in stream:
        lines.append(line)
        if "bergstream: ready" in line:
            ready.set()
    ready.set()


BERGSTREAM = str(Path(sys.executable).parent / "bergstream")


def start_bergstream_run(
    config: Path, address: str, env: dict[str, str] | None = None, what: str = "bergstream run"
) -> ProxyProcess:
    """``bergstream -v run -c config`` as a process, returned once it printed its ready line;
    ``address`` is what the caller connects to (kept on the result)."""
    process = subprocess.Popen(
        [BERGSTREAM, "-v", "run", "-c", str(config)],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env={**os.environ, **(env or {})},
    )
    running = ProxyProcess(process, address, config)
    ready = threading.Event()
    threading.Thread(
        target=pump_stderr, args=(process.stderr, running.stderr_lines, ready), daemon=True
    ).start()
    if not ready.wait(60) or process.poll() is not None:
        running.stop()
        raise RuntimeError(f"{what} did not start:\n{running.log()}")
    return running


def wait_until(predicate: Callable[[], bool], timeout: float = 30, interval: float = 0.2) -> None:
    """Poll ``predicate`` until it is true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")


def require_binary(name: str) -> str:
    """Path of a binary the test needs; fail (not skip) if scripts/setup did not install it."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: run scripts/setup")
    return path


def consume_rows(bootstrap: str, topic: str, count: int) -> list[dict[str, Any]]:
    """The first ``count`` records of ``topic``, read directly (read_committed), as rows of the
    row contract sorted by (partition, offset)."""
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"{topic}-check",
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    rows: list[dict[str, Any]] = []
    try:
        for _ in range(120):
            if len(rows) >= count:
                break
            for message in consumer.consume(count - len(rows), 1.0):
                if message.error():
                    continue
                kind, stamp = message.timestamp()
                record = Record(
                    message.offset(),
                    stamp,
                    message.key(),
                    message.value(),
                    tuple(message.headers() or ()),
                )
                rows.append(record_to_row(message.partition(), record, 1 if kind == 2 else 0))
    finally:
        consumer.close()
    assert len(rows) == count, f"consumed {len(rows)} of {count} records"
    return sort_rows(rows)


def consume_values(
    config: dict[str, Any], topic: str, count: int, timeout: float = 60
) -> list[bytes]:
    """Up to ``count`` record values of ``topic`` from the beginning, read as a new consumer
    group with the confluent-kafka ``config``; a client error raises ``KafkaException``."""
    from confluent_kafka import Consumer, KafkaException

    consumer = Consumer(
        {**config, "group.id": f"g-{uuid.uuid4().hex[:8]}", "auto.offset.reset": "earliest"}
    )
    values: list[bytes] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + timeout
        while len(values) < count and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is None:
                continue
            if message.error():
                raise KafkaException(message.error())
            values.append(message.value())
    finally:
        consumer.close()
    return values


def write_proxy_config(
    path: Path, name: str, port: int, filters: str = "[]", more: str = ""
) -> Path:
    """A ``bergstream run`` config of one virtual cluster ``name`` on ``port`` whose target takes
    its security from the environment like ``examples/proxy.yaml`` (the stack's
    ``BERGSTREAM_KAFKA_CONFIG``); ``filters`` is the YAML of its filter list (flow style), ``more``
    top-level sections after it (e.g. ``lake:``)."""
    path.write_text(
        f"""
virtual_clusters:
  - name: {name}
    target:
      bootstrap: ${{BERGSTREAM_KAFKA_BOOTSTRAP}}
      kafka_client:
        properties_file: ${{BERGSTREAM_KAFKA_CONFIG:-}}
    gateway: {{host: 127.0.0.1, port: {port}, lowest_broker_id: 0, broker_count: 4}}
    filters: {filters}
"""
        + more
    )
    return path


def secure_lake_yaml(home: Path, trigger_seconds: float | None = None) -> str:
    """A ``lake:`` section that takes Kafka's security from the environment like
    ``examples/lake.yaml`` (the secured stack's ``BERGSTREAM_KAFKA_CONFIG``), its catalog and
    warehouse under ``home``; ``trigger_seconds``: the pipeline's trigger interval (None: the
    default)."""
    trigger = (
        f"\n    trigger_interval_seconds: {trigger_seconds}" if trigger_seconds is not None else ""
    )
    return f"""
lake:
  kafka_bootstrap: ${{BERGSTREAM_KAFKA_BOOTSTRAP}}
  kafka_client:
    properties_file: ${{BERGSTREAM_KAFKA_CONFIG:-}}
  catalog:
    type: sql
    uri: "sqlite:///{home}/lake/catalog.db"
    warehouse: "{home}/lake/warehouse"
  pipeline:{trigger}
    checkpoint_dir: "{home}/lake/checkpoints"
    spark_conf: {{spark.driver.memory: 1g, spark.sql.shuffle.partitions: "2"}}
"""


def boto_s3(endpoint: str, key: str, secret: str, token: str | None = None) -> Any:
    """A boto3 S3 client of an S3 gateway at ``endpoint`` (path-style, no retries)."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        aws_session_token=token,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )


def s3_error(call: Callable[[], Any]) -> tuple[str, int]:
    """The S3 error code and HTTP status ``call`` fails with (it must fail)."""
    from botocore.exceptions import ClientError

    with pytest.raises(ClientError) as caught:
        call()
    response: Any = caught.value.response
    return response["Error"]["Code"], response["ResponseMetadata"]["HTTPStatusCode"]


def sort_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` in (partition, offset) order."""
    return sorted(rows, key=lambda row: (row["kafka_partition"], row["kafka_offset"]))


def file_groups(uses: Iterable[tuple[str, str]]) -> dict[str, str]:
    """``(file, heavy group)`` pairs -> each file's group: the heavy groups one file uses
    together are merged into one (named by their sorted names joined with ``+``)."""
    used: dict[str, set[str]] = {}
    for file, group in uses:
        used.setdefault(file, set()).add(group)
    merged: list[set[str]] = []
    for groups in used.values():
        overlapping = [m for m in merged if m & groups]
        union = set(groups).union(*overlapping)
        merged = [m for m in merged if not m & groups] + [union]
    names = {group: "+".join(sorted(m)) for m in merged for group in m}
    return {file: names[next(iter(groups))] for file, groups in used.items()}


def with_reauthentication(
    original: Callable[..., dict[str, str]], reauth_ms: int = SECURE_REAUTH_MS
) -> Callable[..., dict[str, str]]:
    """``kafka_security.server_security_properties`` with brokers that re-authenticate sessions
    every ``reauth_ms`` (KIP-368), for tests to monkeypatch in before ``stack_up``."""

    def properties(files: Any, mode: str, **logins: Any) -> dict[str, str]:
        return {**original(files, mode, **logins), "connections.max.reauth.ms": str(reauth_ms)}

    return properties


def admin_librdkafka(env: dict[str, str]) -> dict[str, str]:
    """confluent-kafka settings of a stack's admin: ``BERGSTREAM_KAFKA_CONFIG`` (its properties
    file) and ``BERGSTREAM_KAFKA_BOOTSTRAP``."""
    from bergstream.core.api import KafkaClientSettings

    settings = KafkaClientSettings.model_validate(
        {"properties_file": env["BERGSTREAM_KAFKA_CONFIG"]}
    )
    return {**settings.librdkafka(), "bootstrap.servers": env["BERGSTREAM_KAFKA_BOOTSTRAP"]}
