"""Shared fixtures: one real local stack per test session, topics per test, proxies as processes."""

from __future__ import annotations

import textwrap
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bergstream.devstack.stack.ports import free_port_block
from tests.support import ProxyProcess, start_bergstream_run

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def stack_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The real local stack (Kafka KRaft, S3, Redis), started once per session by the same code
    as ``bergstream stack up`` and stopped by PID at the end."""
    from bergstream.devstack.stack import stack_down, stack_up

    home = tmp_path_factory.mktemp("bergstream-home")
    try:
        env = stack_up(home=home)
    except Exception:
        stack_down(home=home)
        raise
    try:
        yield env.as_dict()
    finally:
        stack_down(home=home)


@pytest.fixture(scope="session")
def kafka_bootstrap(stack_env: dict[str, str]) -> str:
    """``host:port`` of the real Kafka broker."""
    return stack_env["BERGSTREAM_KAFKA_BOOTSTRAP"]


@pytest.fixture(scope="session")
def new_topic(kafka_bootstrap: str) -> Callable[..., str]:
    """Create a uniquely named topic directly on Kafka; returns its name (session-scoped, so
    module fixtures can create topics too)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})

    def create(partitions: int = 3, prefix: str = "t", **configs: str) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        # Tests produce records with old timestamps (0, 2023, ...): time-based retention would
        # delete them within seconds, so test topics keep everything unless a test says so.
        settings = {"retention.ms": "-1", **configs}
        futures = admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1, config=settings)]
        )
        futures[name].result(timeout=30)
        return name

    return create


@pytest.fixture
def run_proxy(kafka_bootstrap: str, tmp_path: Path) -> Iterator[Callable[..., ProxyProcess]]:
    """Start ``bergstream run -c`` on a config with one virtual cluster in front of Kafka.

    ``filters_yaml`` is the YAML list of filters; ``env`` adds environment variables (for
    example PYTHONPATH to a third-party plugin installed in a temporary directory).
    """
    started: list[ProxyProcess] = []

    def start(filters_yaml: str = "[]", env: dict[str, str] | None = None) -> ProxyProcess:
        port = free_port_block(4)
        config = tmp_path / f"proxy-{port}.yaml"
        config.write_text(
            textwrap.dedent(
                f"""
                virtual_clusters:
                  - name: test
                    target: {{bootstrap: "{kafka_bootstrap}"}}
                    gateway: {{host: 127.0.0.1, port: {port}, lowest_broker_id: 0,
                              broker_count: 3}}
                    filters: {filters_yaml}
                """
            )
        )
        proxy = start_bergstream_run(config, f"127.0.0.1:{port}", env, "the proxy")
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        proxy.stop()
