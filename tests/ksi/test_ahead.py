"""Cold answers built ahead: a sequential consumer's next Fetch is answered from batches
encoded while it read the last ones, byte for byte what a fresh build gives, and never from a
build made for another ask or another table state."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from bergstream.core.lake import ResolvedLake
from bergstream.plugins.ksi_fetch_filter.ahead import AheadKey, Built, BuiltAhead
from bergstream.plugins.ksi_fetch_filter.config import KsiConfig
from bergstream.plugins.ksi_fetch_filter.planner import FetchAsk, plan_fetch
from bergstream.plugins.ksi_fetch_filter.store import ColdStore
from tests.kits.coldset_tables import make_lake, make_record, write_cold

BUDGET = 3_000
BATCH_MAX_BYTES = 1_024


@pytest.fixture
def lake(tmp_path: Path) -> ResolvedLake:
    return make_lake(tmp_path)


def _store(lake: ResolvedLake, ahead: bool) -> ColdStore:
    store = ColdStore(lake, KsiConfig(topics=["t"]))
    if not ahead:
        store.ahead.max_bytes = 0  # nothing is ever built ahead
    return store


def _consume(store: ColdStore, partitions: tuple[int, ...], pause: float = 0.0) -> list[bytes]:
    """Every Fetch answer of a consumer reading ``partitions`` from offset 0 to the end."""
    offsets = dict.fromkeys(partitions, 0)
    answers: list[bytes] = []
    while True:
        asks = [FetchAsk("t", p, o, BUDGET) for p, o in offsets.items()]
        got = plan_fetch(store, asks, 10 * BUDGET, BATCH_MAX_BYTES)
        progressed = False
        for partition in partitions:
            answer = got[("t", partition)]
            if answer.records:
                answers.append(answer.records)
                offsets[partition] = answer.next_offset
                progressed = True
        if not progressed:
            return answers
        time.sleep(pause)  # the consumer reading what it got


def test_answers_built_ahead_are_the_bytes_of_a_fresh_build(lake: ResolvedLake) -> None:
    rows = [(p, 0, make_record(o)) for p in (0, 1) for o in range(400)]
    write_cold(lake, "t", rows, {0: 400, 1: 400}, rows_per_file=150)
    fresh = _store(lake, ahead=False)
    expected = _consume(fresh, (0, 1))
    assert fresh.ahead.hits == 0
    ahead = _store(lake, ahead=True)
    assert _consume(ahead, (0, 1), pause=0.01) == expected
    # Every Fetch after the first of each partition found its answer built.
    assert ahead.ahead.hits >= len(expected) - 2 - 2, (ahead.ahead.hits, len(expected))
    fresh.close()
    ahead.close()


def test_an_answer_built_for_an_older_snapshot_is_not_used(lake: ResolvedLake) -> None:
    write_cold(lake, "t", [(0, 0, make_record(o)) for o in range(200)], {0: 200})
    store = ColdStore(lake, KsiConfig(topics=["t"], table_refresh_seconds=0.01))
    first = plan_fetch(store, [FetchAsk("t", 0, 0, BUDGET)], BUDGET, BATCH_MAX_BYTES)[("t", 0)]
    assert first.records and first.next_offset is not None
    time.sleep(0.2)  # the answer for next_offset is built, on this snapshot
    # The pipeline commits more rows (a new snapshot, a later boundary): the next answer
    # must see them (the built one stopped at the old boundary, claiming its gap).
    write_cold(lake, "t", [(0, 0, make_record(o)) for o in range(200, 260)], {0: 260})
    time.sleep(0.05)
    after = plan_fetch(
        store, [FetchAsk("t", 0, first.next_offset, BUDGET)], BUDGET, BATCH_MAX_BYTES
    )[("t", 0)]
    fresh = _store(lake, ahead=False)
    again = plan_fetch(
        fresh, [FetchAsk("t", 0, first.next_offset, BUDGET)], BUDGET, BATCH_MAX_BYTES
    )[("t", 0)]
    assert after.records == again.records and after.next_offset == again.next_offset
    assert store.ahead.hits == 0
    store.close()
    fresh.close()


def _built(size: int) -> Built:
    from bergstream.plugins.ksi_fetch_filter.batches import ColdBatches

    return Built(None, ColdBatches(b"x" * size, 1, 1))


def test_built_ahead_keeps_within_its_bound_oldest_dropped_first() -> None:
    with ThreadPoolExecutor(1) as executor:
        ahead = BuiltAhead(executor, max_bytes=250)
        keys = [AheadKey("t", 0, offset, 100, True, 1) for offset in range(3)]
        for key in keys:
            ahead.schedule(key, lambda: _built(10))
        time.sleep(0.1)
        assert ahead.take(keys[0]) is None  # dropped to make room for the third
        assert ahead.take(keys[1]) is not None and ahead.take(keys[2]) is not None
        assert ahead.take(keys[2]) is None  # taken once
        ahead.schedule(AheadKey("t", 0, 9, 300, True, 1), lambda: _built(10))  # over the bound
        assert ahead.take(AheadKey("t", 0, 9, 300, True, 1)) is None
        assert ahead.hits == 2


def test_a_failed_build_is_built_again_by_the_fetch() -> None:
    with ThreadPoolExecutor(1) as executor:
        ahead = BuiltAhead(executor, max_bytes=1_000)
        key = AheadKey("t", 0, 0, 100, True, 1)

        def fail() -> Built:
            raise OSError("disk gone")

        ahead.schedule(key, fail)
        time.sleep(0.05)
        assert ahead.take(key) is None and ahead.hits == 0
