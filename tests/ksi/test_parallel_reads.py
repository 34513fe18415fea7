"""A Fetch needing several data files no cache holds reads them at once on the reader threads
(``parallel_reads``), with the same answers as reading them one after the other.

The wrapper around ``ColdStore._read_slices`` makes each row-group read last
``READ_SECONDS`` longer, as a read from an object store waits on the network: only so can a
test see whether two reads were in progress at the same time."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from bergstream.core.lake import ResolvedLake
from bergstream.plugins.ksi_fetch_filter.config import KsiConfig
from bergstream.plugins.ksi_fetch_filter.planner import ColdAnswer, FetchAsk, plan_fetch
from bergstream.plugins.ksi_fetch_filter.store import ColdStore
from tests.kits.coldset_tables import make_lake, make_record, write_cold

PARTITIONS = 4
RECORDS = 50
READ_SECONDS = 0.25
TOPIC = "p"


@pytest.fixture
def lake(tmp_path: Path) -> ResolvedLake:
    lake = make_lake(tmp_path)
    # Identity-partitioned: one data file per Kafka partition.
    write_cold(
        lake,
        TOPIC,
        [(p, 0, make_record(o)) for p in range(PARTITIONS) for o in range(RECORDS)],
        dict.fromkeys(range(PARTITIONS), RECORDS),
    )
    return lake


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, float, tuple[int, ...]]]:
    """(start, end, partitions) of every row group read, each held ``READ_SECONDS`` longer."""
    spans: list[tuple[float, float, tuple[int, ...]]] = []
    lock = threading.Lock()
    original = ColdStore._read_slices

    def slow(self: ColdStore, ref: Any, partitions: list[int], encode: Any) -> Any:
        start = time.monotonic()
        time.sleep(READ_SECONDS)
        out = original(self, ref, partitions, encode)
        with lock:
            spans.append((start, time.monotonic(), tuple(partitions)))
        return out

    monkeypatch.setattr(ColdStore, "_read_slices", slow)
    return spans


def _fetch(lake: ResolvedLake, offsets: dict[int, int], **settings: Any) -> dict[Any, ColdAnswer]:
    store = ColdStore(lake, KsiConfig(topics=[TOPIC], reader_threads=4, **settings))
    store.ahead.max_bytes = 0  # nothing built ahead: every read is the fetch's own
    try:
        asks = [FetchAsk(TOPIC, p, o, 1_000_000) for p, o in offsets.items()]
        return plan_fetch(store, asks, 10_000_000, 1_024)
    finally:
        store.close()


def _most_at_once(spans: list[tuple[float, float, tuple[int, ...]]]) -> int:
    """The largest number of reads in progress at one moment."""
    edges = sorted([(start, 1) for start, _, _ in spans] + [(end, -1) for _, end, _ in spans])
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


def test_a_fetch_reads_its_files_at_once_with_the_same_answers(
    lake: ResolvedLake, reads: list[tuple[float, float, tuple[int, ...]]]
) -> None:
    offsets = {p: 7 * p for p in range(PARTITIONS)}
    one_by_one = _fetch(lake, offsets, parallel_reads=False)
    assert len(reads) == PARTITIONS and _most_at_once(reads) == 1
    reads.clear()
    at_once = _fetch(lake, offsets)
    assert {k: (a.records, a.next_offset, a.error) for k, a in at_once.items()} == {
        k: (a.records, a.next_offset, a.error) for k, a in one_by_one.items()
    }
    assert all(a.records and a.error is None for a in at_once.values())
    assert _most_at_once(reads) >= 2, reads
    # Each partition's row group read once, by the fetch or by the read it started.
    assert sorted(p for _, _, parts in reads for p in parts) == list(range(PARTITIONS))


def test_cached_files_and_kafka_offsets_start_no_read(
    lake: ResolvedLake, reads: list[tuple[float, float, tuple[int, ...]]]
) -> None:
    config = KsiConfig(topics=[TOPIC], reader_threads=4, read_ahead_segments=0)
    store = ColdStore(lake, config)
    store.ahead.max_bytes = 0
    try:
        first = plan_fetch(store, [FetchAsk(TOPIC, 0, 0, 1_000_000)], 10_000_000, 1_024)
        assert first[(TOPIC, 0)].records
        reads.clear()
        # Partition 0 cached, partition 1 past the cold range (Kafka's): no read at all.
        asks = [FetchAsk(TOPIC, 0, 3, 1_000_000), FetchAsk(TOPIC, 1, RECORDS, 1_000_000)]
        answers = plan_fetch(store, asks, 10_000_000, 1_024)
        time.sleep(2 * READ_SECONDS)  # a read wrongly started would have ended by now
        assert reads == []
        assert answers[(TOPIC, 0)].records and answers[(TOPIC, 1)].records is None
    finally:
        store.close()


def test_reads_start_only_as_far_as_the_fetch_can_take(
    lake: ResolvedLake, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[int] = []
    monkeypatch.setattr(
        ColdStore,
        "start_read",
        lambda self, cold, partition, offset, siblings: started.append(partition),
    )
    store = ColdStore(lake, KsiConfig(topics=[TOPIC], read_ahead_segments=0))
    try:
        # Up to 1,000 bytes a partition, 2,500 in all: the files of partitions 0 to 2 may be
        # needed; the first is the fetch's own read, so reads start for 1 and 2.
        asks = [FetchAsk(TOPIC, p, 0, 1_000) for p in range(PARTITIONS)]
        plan_fetch(store, asks, 2_500, 1_024)
        assert started == [1, 2]
    finally:
        store.close()


def test_no_read_for_a_partition_the_response_has_no_room_for(
    lake: ResolvedLake, reads: list[tuple[float, float, tuple[int, ...]]]
) -> None:
    store = ColdStore(lake, KsiConfig(topics=[TOPIC], read_ahead_segments=0, parallel_reads=False))
    store.ahead.max_bytes = 0
    try:
        # A max_bytes that partition 0's answer leaves no room in for a batch (the encoder
        # packs whole batches: the room left depends on the budget, so look for one).
        def alone(max_bytes: int) -> bytes:
            answer = plan_fetch(store, [FetchAsk(TOPIC, 0, 0, max_bytes)], max_bytes, 1_024)
            return answer[(TOPIC, 0)].records or b""

        max_bytes = next(m for m in range(3_000, 1_000, -1) if m - len(alone(m)) <= 61)
        served = alone(max_bytes)
        reads.clear()
        store.segments.clear()
        store._slice_index.clear()
        asks = [FetchAsk(TOPIC, 0, 0, 1_000_000), FetchAsk(TOPIC, 1, 0, 1_000_000)]
        answers = plan_fetch(store, asks, max_bytes, 1_024)
        assert answers[(TOPIC, 0)].records == served
        assert answers[(TOPIC, 1)].records == b"" and answers[(TOPIC, 1)].next_offset == 0
        assert [parts for _, _, parts in reads] == [(0,)]
    finally:
        store.close()


def test_parallel_reads_takes_a_boolean_only() -> None:
    with pytest.raises(ValidationError, match="parallel_reads"):
        KsiConfig(parallel_reads="sometimes")
