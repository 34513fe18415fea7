"""One ISK gateway per module with a Trino catalog on it (on the session's one Trino: the
``trino`` fixture of tests/conftest.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from bergstream.devstack.stack.trino import TrinoServer, iceberg_rest_catalog_sql
from tests.isk_e2e.helpers import Gateway, start_gateway


@dataclass
class TrinoCatalog:
    """A Trino catalog (``name``) on an ISK gateway."""

    trino: TrinoServer
    gateway: Gateway
    name: str

    def table(self, namespace: str, topic: str, suffix: str = "") -> str:
        """The quoted name of ``namespace.topic`` (``suffix``: ``$snapshots`` etc.)."""
        return f'{self.name}.{namespace}."{topic}{suffix}"'


def create_catalog(trino: TrinoServer, gateway: Gateway) -> TrinoCatalog:
    """``CREATE CATALOG`` on ``gateway`` with only the REST catalog's URI, vended credentials
    and the S3 endpoint, region and path-style settings."""
    name = f"isk_{uuid.uuid4().hex[:8]}"
    trino.query(iceberg_rest_catalog_sql(name, gateway.catalog_url, gateway.s3_url))
    return TrinoCatalog(trino, gateway, name)


@pytest.fixture(scope="module")
def gateway(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """The ``isk`` service over the session's Kafka, small chunks (8 offsets): tables mix
    sealed, indexed chunks with an unsealed tail."""
    running = start_gateway(kafka_bootstrap, tmp_path_factory.mktemp("isk"), chunk_records=8)
    try:
        yield running
    finally:
        code = running.process.stop()
        assert code == 0, f"bergstream run exited with {code}:\n{running.process.log()}"


@pytest.fixture(scope="module")
def catalog(trino: TrinoServer, gateway: Gateway) -> Iterator[TrinoCatalog]:
    """A Trino catalog on the module's gateway, dropped afterwards."""
    created = create_catalog(trino, gateway)
    try:
        yield created
    finally:
        trino.query(f"DROP CATALOG {created.name}")
