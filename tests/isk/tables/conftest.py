"""Fixtures of the table tests: a fake Kafka log with one two-partition topic."""

from __future__ import annotations

import pytest

from tests.kits.fake_log import FakeLog


@pytest.fixture
def log() -> FakeLog:
    """A fake Kafka log with topic ``orders`` of two partitions, no records yet."""
    log = FakeLog()
    log.create("orders", 2)
    return log
