"""Coldset reads planned per table and read per row group: a table is planned once for all its
partitions, a row group read once for every partition of a Fetch (or of read-ahead) it holds,
and the answers are byte for byte those of reading each partition alone."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.expressions import EqualTo
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.table import DataScan

from bergstream.core.api import table_boundary
from bergstream.core.lake import ResolvedLake, load_catalog
from bergstream.core.typed.row_contract import (
    BOUNDARY_PROPERTY,
    ROW_ARROW_SCHEMA,
    format_boundary,
    record_to_row,
)
from bergstream.plugins.ksi_fetch_filter.config import KsiConfig
from bergstream.plugins.ksi_fetch_filter.planner import FetchAsk, plan_fetch
from bergstream.plugins.ksi_fetch_filter.store import ColdStore
from tests.kits.coldset_tables import make_lake, make_record, row_table, write_cold

BUDGET = 4_000
BATCH_MAX_BYTES = 1_024


@pytest.fixture
def lake(tmp_path: Path) -> ResolvedLake:
    return make_lake(tmp_path)


@pytest.fixture
def plans(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per ``plan_files`` PyIceberg runs."""
    calls: list[int] = []
    original = DataScan.plan_files

    def counted(self: DataScan) -> Any:
        calls.append(1)
        return original(self)

    monkeypatch.setattr(DataScan, "plan_files", counted)
    return calls


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, tuple[int, ...]]]:
    """(path, row group, partitions) of every row group the stores read."""
    calls: list[tuple[str, int, tuple[int, ...]]] = []
    original = ColdStore._read_slices

    def counted(self: ColdStore, ref: Any, partitions: list[int], encode: Any) -> Any:
        calls.append((ref.path, ref.row_group, tuple(partitions)))
        return original(self, ref, partitions, encode)

    monkeypatch.setattr(ColdStore, "_read_slices", counted)
    return calls


def write_interleaved(
    lake: ResolvedLake, topic: str, partitions: list[int], offsets: range, row_group_rows: int
) -> None:
    """Append one unpartitioned data file whose rows interleave ``partitions`` (offset by
    offset), ``row_group_rows`` rows per row group, the boundary past the last offset."""
    table = row_table(
        lake,
        topic,
        partition_spec=UNPARTITIONED_PARTITION_SPEC,
        properties={"write.parquet.row-group-limit": str(row_group_rows)},
    )
    rows = [record_to_row(p, make_record(o), 0) for o in offsets for p in partitions]
    boundary = {**table_boundary(table), **dict.fromkeys(partitions, offsets.stop)}
    table.append(
        pa.Table.from_pylist(rows, schema=ROW_ARROW_SCHEMA),
        snapshot_properties={BOUNDARY_PROPERTY: format_boundary(boundary)},
    )


def _store(lake: ResolvedLake, topic: str, **settings: Any) -> ColdStore:
    store = ColdStore(lake, KsiConfig(topics=[topic], **settings))
    store.ahead.max_bytes = 0  # nothing built ahead: every read is the fetch's own
    return store


def _consume(store: ColdStore, topic: str, partitions: list[int], alone: bool) -> Iterator[bytes]:
    """Every answer of a consumer reading ``partitions`` from 0 to the end: one Fetch for all
    of them, or (``alone``) one Fetch per partition."""
    offsets = dict.fromkeys(partitions, 0)
    while True:
        asks = [FetchAsk(topic, p, o, BUDGET) for p, o in offsets.items()]
        fetches = [[ask] for ask in asks] if alone else [asks]
        progressed = False
        for fetch in fetches:
            for (_, partition), answer in plan_fetch(
                store, fetch, 100 * BUDGET, BATCH_MAX_BYTES
            ).items():
                assert answer.error is None, answer.error
                if answer.records:
                    yield answer.records
                    assert answer.next_offset is not None
                    offsets[partition] = answer.next_offset
                    progressed = True
        if not progressed:
            return


def test_a_table_is_planned_once_for_all_its_partitions(
    lake: ResolvedLake, plans: list[int]
) -> None:
    # Files spanning every partition, then one spanning partitions 3 to 5 only.
    write_interleaved(lake, "u", list(range(12)), range(0, 40), row_group_rows=100)
    write_interleaved(lake, "u", [3, 4, 5], range(40, 60), row_group_rows=100)
    # Identity-partitioned: one file per partition, its partition in the file's record.
    write_cold(
        lake,
        "p",
        [(p, 0, make_record(o)) for p in range(12) for o in range(30)],
        {p: 30 for p in range(12)},
    )
    catalog = load_catalog(lake)
    for topic in ("u", "p"):
        store = ColdStore(lake, KsiConfig(topics=[topic]))
        cold = store.table(topic)
        assert cold is not None
        plans.clear()
        for partition in range(12):
            assert cold.first_offset(partition) == 0
            read = cold.read(partition, 0)
            assert read is not None and read.segment.offsets[read.start] == 0
        assert len(plans) == 1, topic  # not once per partition
        # Each partition gets the files a scan filtered on it keeps.
        table = catalog.load_table(lake.table_identifier(topic))
        snap = cold._current()
        for partition in range(12):
            scan = table.scan(row_filter=EqualTo("kafka_partition", partition))
            expected = {task.file.file_path for task in scan.plan_files()}
            assert {f.path for f in cold._files(snap, partition)} == expected
        store.close()


def test_a_row_group_is_read_once_for_the_partitions_of_a_fetch(
    lake: ResolvedLake, reads: list[tuple[str, int, tuple[int, ...]]]
) -> None:
    partitions = list(range(8))
    write_interleaved(lake, "t", partitions, range(0, 120), row_group_rows=240)  # 4 row groups
    alone = _store(lake, "t", read_ahead_segments=0)
    expected = list(_consume(alone, "t", partitions, alone=True))
    row_groups = {(path, group) for path, group, _ in reads}
    assert len(row_groups) == 4
    assert len(reads) == 4 * len(partitions)  # read once per partition
    reads.clear()
    together = _store(lake, "t", read_ahead_segments=0)
    assert sorted(_consume(together, "t", partitions, alone=False)) == sorted(expected)
    assert len(reads) == 4  # once per row group, split for all eight partitions
    assert {len(asked) for _, _, asked in reads} == {len(partitions)}
    alone.close()
    together.close()


def test_partitions_past_a_row_group_are_not_read_with_it(
    lake: ResolvedLake, reads: list[tuple[str, int, tuple[int, ...]]]
) -> None:
    write_interleaved(lake, "t", [0, 1, 2], range(0, 100), row_group_rows=60)  # 20 offsets each
    store = _store(lake, "t", read_ahead_segments=0)
    asks = [FetchAsk("t", 0, 0, BUDGET), FetchAsk("t", 1, 0, BUDGET), FetchAsk("t", 2, 70, BUDGET)]
    answers = plan_fetch(store, asks, 100 * BUDGET, BATCH_MAX_BYTES)
    assert all(answers[("t", p)].records for p in (0, 1, 2))
    # Partition 2 asks from offset 70: the first row group (offsets 0-19) is not read for it.
    assert reads[0][1:] == (0, (0, 1))
    assert [group for _, group, _ in reads] == [0, 3]
    store.close()


def test_a_cache_too_small_for_the_siblings_still_answers_each_partition(
    lake: ResolvedLake, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bergstream.plugins.ksi_fetch_filter import store as store_module

    monkeypatch.setattr(store_module, "_SLICE_BYTES", 4_000)
    partitions = list(range(6))
    write_interleaved(lake, "t", partitions, range(0, 200), row_group_rows=1_200)
    expected = list(_consume(_store(lake, "t", read_ahead_segments=0), "t", partitions, True))
    small = _store(lake, "t", read_ahead_segments=0, cache_max_bytes=1_048_576)
    small.segments.max_bytes = 30_000  # below one row group's slices of all six partitions
    assert sorted(_consume(small, "t", partitions, alone=False)) == sorted(expected)
    assert small.segments.size <= 30_000
    small.close()


def test_read_ahead_of_many_partitions_takes_one_reader_thread_a_turn_at_a_time(
    lake: ResolvedLake,
    reads: list[tuple[str, int, tuple[int, ...]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from bergstream.plugins.ksi_fetch_filter import store as store_module

    monkeypatch.setattr(store_module, "_AHEAD_CHUNK", 5)
    partitions = list(range(20))
    write_interleaved(lake, "t", partitions, range(0, 30), row_group_rows=200)  # 3 row groups
    store = _store(lake, "t", read_ahead_segments=2, reader_threads=1)
    cold = store.table("t")
    assert cold is not None
    assert cold.first_offset(0) == 0  # planned and loaded before counting
    submitted: list[object] = []
    original = store.executor.submit

    def counted(function: Any, *args: Any) -> Any:
        submitted.append(function)
        return original(function, *args)

    monkeypatch.setattr(store.executor, "submit", counted)
    gate = threading.Event()
    original(gate.wait)  # the reader thread busy while the read-ahead is queued
    store.prefetch_many(cold, dict.fromkeys(partitions, 0))
    assert len(submitted) == 1  # one turn queued, not one task per partition
    gate.set()
    deadline = time.monotonic() + 10
    while store._ahead_draining and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(submitted) == 4  # 20 partitions, 5 a turn, each turn queued by the last
    # The two row groups after offset 0, read once a turn for the turn's five partitions.
    assert sorted((group, asked) for _, group, asked in reads) == [
        (group, tuple(range(first, first + 5))) for group in (0, 1) for first in (0, 5, 10, 15)
    ]
    path = reads[0][0]
    assert all((path, group, p) in store._slice_index for group in (0, 1) for p in partitions)
    store.close()


def test_a_row_group_split_by_partition_gives_each_the_slices_it_gets_alone(
    tmp_path: Path,
) -> None:
    import random

    import pyarrow.parquet as pq

    from bergstream.plugins.ksi_fetch_filter.segments import (
        PAYLOAD_COLUMNS,
        read_row_group_partitions,
        read_row_group_slices,
    )

    rows = [(p, o) for p in range(5) for o in range(300)]
    random.Random(3).shuffle(rows)  # interleaved and out of offset order
    rows += [(1, 4), (2, 7)]  # offsets written twice: the first row of each is kept
    path = tmp_path / "f.parquet"
    table = pa.Table.from_pylist(
        [record_to_row(p, make_record(o), 0) for p, o in rows], schema=ROW_ARROW_SCHEMA
    )
    pq.write_table(table, path, row_group_size=len(rows))
    encoded: list[int] = []

    def encode(part: pa.Table) -> pa.Table:
        encoded.append(len(set(part.column("kafka_partition").to_pylist())))
        return part.select(list(PAYLOAD_COLUMNS))

    parquet = pq.ParquetFile(path)
    together = read_row_group_partitions(parquet, 0, [0, 2, 3, 9], 3_000, encode)
    assert set(together) == {0, 2, 3, 9} and together[9] == []  # 9: no rows there
    for partition in (0, 2, 3):
        alone = read_row_group_slices(parquet, 0, partition, 3_000)
        assert len(together[partition]) == len(alone) > 1
        for mine, theirs in zip(together[partition], alone, strict=True):
            assert mine.offsets.tolist() == theirs.offsets.tolist()
            assert mine.records(0, len(mine)) == theirs.records(0, len(theirs))
    assert encoded and set(encoded) == {1}  # each encoder call saw one partition's rows


def test_built_ahead_answers_of_a_large_request_queue_only_those_kept() -> None:
    from concurrent.futures import ThreadPoolExecutor

    from bergstream.plugins.ksi_fetch_filter.ahead import AheadKey, Built, BuiltAhead

    with ThreadPoolExecutor(1) as executor:
        submitted: list[object] = []
        original = executor.submit

        def counted(function: Any, *args: Any) -> Any:
            submitted.append(function)
            return original(function, *args)

        executor.submit = counted  # type: ignore[method-assign]
        ahead = BuiltAhead(executor, max_bytes=1_000)
        keys = [AheadKey("t", p, 5, 100, False, 1) for p in range(10_000)]
        keys.append(AheadKey("t", 10_000, 5, 5_000, False, 1))  # over the bound: never built
        ahead.schedule_many([(key, lambda: Built(None, None)) for key in keys])
        assert len(submitted) == 10  # the last ten that fit, not 10,000 submitted then dropped
        time.sleep(0.05)
        assert all(ahead.take(key) is not None for key in keys[-11:-1])
        assert ahead.take(keys[-12]) is None and ahead.take(keys[-1]) is None


def test_demoted_bytes_stay_counted_through_reads_puts_and_evictions() -> None:
    from bergstream.plugins.ksi_fetch_filter.cache import ByteBoundedCache

    cache: ByteBoundedCache[str] = ByteBoundedCache(100)
    for key in "abcd":
        cache.put(key, key, 20)
    cache.demote("a")
    cache.demote("a")  # twice: counted once
    cache.demote("b")
    assert cache.live_size == 40
    assert cache.get("a") == "a" and cache.live_size == 60  # read again: live
    cache.put("b", "b", 10)  # replaced: live again
    assert cache.live_size == 70
    cache.demote("c")
    cache.put("e", "e", 50)  # evicts c (demoted, first in line), then the oldest
    assert "c" not in cache and cache.size <= 100
    assert cache.live_size == cache.size
