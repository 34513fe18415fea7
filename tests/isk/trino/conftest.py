"""One ISK gateway per module with a Trino catalog on it (on the session's one Trino: the
``trino`` fixture of tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bergstream.devstack.stack.trino import TrinoServer
from tests.kits.isk_gateway import Gateway, start_gateway
from tests.kits.trino import TrinoCatalog, create_catalog


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
