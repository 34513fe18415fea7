"""One ``bergstream run`` process serving the ``isk`` service per test module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.kits.isk_gateway import Gateway, start_gateway


@pytest.fixture(scope="module")
def gateway(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """The ``isk`` service over the session's Kafka, with small chunks (8 offsets) so tables
    mix sealed, indexed chunks with an unsealed tail."""
    running = start_gateway(kafka_bootstrap, tmp_path_factory.mktemp("isk"), chunk_records=8)
    try:
        yield running
    finally:
        code = running.process.stop()
        assert code == 0, f"bergstream run exited with {code}:\n{running.process.log()}"
