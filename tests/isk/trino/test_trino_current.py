"""Trino 476 reads ``current`` (the state of an upsert topic: the lake's state table, a rows
file and position deletes) and ``rejected`` through ISK, with the stage of
tests/isk/current/test_current_upsert.py (from tests/kits/upsert_topic.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from bergstream.devstack.stack.trino import TrinoServer
from tests.kits.trino import TrinoCatalog, create_catalog
from tests.kits.upsert_topic import Stage, replay, run_upsert_stage

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def current_stage(
    kafka_bootstrap: str,
    new_topic: Callable[..., str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stage]:
    """The stage of test_current_upsert.py (its own instance in this module)."""
    yield from run_upsert_stage(kafka_bootstrap, new_topic, tmp_path_factory)


@pytest.fixture(scope="module")
def current_catalog(trino: TrinoServer, current_stage: Stage) -> Iterator[TrinoCatalog]:
    """A Trino catalog on the stage's gateway, dropped afterwards."""
    created = create_catalog(trino, current_stage.gateway)
    try:
        yield created
    finally:
        trino.query(f"DROP CATALOG {created.name}")


def test_trino_reads_the_current_state(current_catalog: TrinoCatalog, current_stage: Stage) -> None:
    table = current_catalog.table("current", current_stage.topic)
    rows = current_catalog.trino.query(
        f"SELECT to_hex(kafka_key), to_hex(kafka_value) FROM {table}"
    ).rows
    state = {bytes.fromhex(k): bytes.fromhex(v) for k, v in rows}
    expected = replay(current_stage.produced)
    assert len(rows) == len(expected)
    assert state == expected
    count = current_catalog.trino.query(f"SELECT count(*) FROM {table}").rows
    assert count == [(len(expected),)]
    rejected = current_catalog.table("rejected", current_stage.topic)
    reasons = current_catalog.trino.query(f"SELECT reason FROM {rejected}").rows
    assert reasons and all(r[0].startswith("no key") for r in reasons)
