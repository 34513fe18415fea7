"""Pruned, cached reads of a coldset table written with PyIceberg."""

from __future__ import annotations

from pathlib import Path

import pytest

from bergstream.core.lake import ResolvedLake
from bergstream.plugins.ksi_fetch_filter.cache import ByteBoundedCache
from bergstream.plugins.ksi_fetch_filter.coldset import ColdsetError
from bergstream.plugins.ksi_fetch_filter.config import KsiConfig
from bergstream.plugins.ksi_fetch_filter.store import ColdStore
from tests.kits.coldset_tables import make_lake, make_record, write_cold


@pytest.fixture
def lake(tmp_path: Path) -> ResolvedLake:
    return make_lake(tmp_path)


def _store(lake: ResolvedLake, **settings: object) -> ColdStore:
    return ColdStore(lake, KsiConfig(topics=["t"], **settings))


def test_sequential_reads_return_every_row_once(lake: ResolvedLake) -> None:
    write_cold(
        lake, "t", [(p, 0, make_record(o)) for p in (0, 1) for o in range(3, 420)], {0: 420, 1: 420}
    )
    store = _store(lake)
    cold = store.table("t")
    assert cold is not None
    assert cold.boundary(1) == 420 and cold.first_offset(1) == 3
    seen = []
    offset = 0
    while (read := cold.read(1, offset)) is not None:
        rows = read.segment.records(read.start, read.stop)
        seen.extend(record for _, record in rows)
        offset = rows[-1][1].offset + 1
    assert seen == [make_record(o) for o in range(3, 420)]
    store.close()


def test_a_read_opens_only_the_files_it_needs(lake: ResolvedLake) -> None:
    write_cold(
        lake, "t", [(0, 0, make_record(o)) for o in range(1000)], {0: 1000}, rows_per_file=100
    )
    store = _store(lake, read_ahead_segments=0)
    cold = store.table("t")
    assert cold is not None
    read = cold.read(0, 555)
    assert read is not None
    assert read.segment.offsets[read.start] == 555
    assert read.segment.offsets[read.stop - 1] == 599
    assert len(store._footers) == 1  # one footer of ten files read
    assert len(store.segments) == 1
    store.close()


def test_gaps_are_skipped_and_the_tail_reaches_the_boundary(lake: ResolvedLake) -> None:
    write_cold(lake, "t", [(0, 0, make_record(o)) for o in range(0, 100, 2)], {0: 105})
    store = _store(lake)
    cold = store.table("t")
    assert cold is not None
    read = cold.read(0, 51)
    assert read is not None and read.segment.offsets[read.start] == 52
    assert read.tail == 104  # the rows end the cold range: a batch may claim up to 104
    assert cold.read(0, 99) is None  # only the gap is left
    store.close()


def test_offsets_at_or_above_the_boundary_are_not_cold(lake: ResolvedLake) -> None:
    write_cold(lake, "t", [(0, 0, make_record(o)) for o in range(50)], {0: 40})
    store = _store(lake)
    cold = store.table("t")
    assert cold is not None
    read = cold.read(0, 30)
    assert read is not None and read.segment.offsets[read.stop - 1] == 39
    assert cold.read(0, 40) is None
    assert cold.read(5, 0) is None  # a partition the table never saw
    store.close()


def test_timestamp_lookup_finds_the_first_offset_at_or_after(lake: ResolvedLake) -> None:
    stamps = {o: 1000 + o * 10 for o in range(300)}
    stamps[150] = 5  # out of order, as producers may set
    write_cold(
        lake,
        "t",
        [(0, 0, make_record(o, timestamp=stamps[o])) for o in range(300)],
        {0: 300},
        rows_per_file=50,
    )
    store = _store(lake)
    cold = store.table("t")
    assert cold is not None
    assert cold.offset_for_timestamp(0, 1000 + 123 * 10) == (123, 2230)
    assert cold.offset_for_timestamp(0, 1001) == (1, 1010)
    assert cold.offset_for_timestamp(0, 0) == (0, 1000)
    assert cold.offset_for_timestamp(0, 10**12) is None
    store.close()


def test_a_missing_table_has_no_cold_rows(lake: ResolvedLake) -> None:
    store = _store(lake)
    cold = store.table("t")
    assert cold is not None
    assert cold.boundary(0) is None and cold.read(0, 0) is None
    store.close()


def test_an_unreachable_catalog_is_a_coldset_error(lake: ResolvedLake) -> None:
    def broken(_: ResolvedLake) -> object:
        raise OSError("connection refused")

    store = ColdStore(lake, KsiConfig(topics=["t"]), catalog_factory=broken)  # type: ignore[arg-type]
    cold = store.table("t")
    assert cold is not None
    with pytest.raises(ColdsetError, match="connection refused"):
        cold.read(0, 0)
    store.close()


def test_the_cache_keeps_within_its_byte_bound() -> None:
    cache: ByteBoundedCache[str] = ByteBoundedCache(100)
    for i in range(10):
        cache.put(i, f"v{i}", 30)
    assert cache.size <= 100 and len(cache) == 3
    assert cache.get(9) == "v9" and cache.get(0) is None
    cache.put("big", "x", 101)
    assert "big" not in cache


def test_read_ahead_loads_the_next_row_groups(lake: ResolvedLake) -> None:
    import time

    write_cold(lake, "t", [(0, 0, make_record(o)) for o in range(600)], {0: 600}, rows_per_file=100)
    store = _store(lake, read_ahead_segments=2)
    cold = store.table("t")
    assert cold is not None
    read = cold.read(0, 0)
    assert read is not None
    store.prefetch(cold, 0, read.segment.offsets[read.stop - 1] + 1)
    deadline = time.monotonic() + 10
    while len(store.segments) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(store.segments) == 3  # the one read and the two after it
    store.close()


def test_row_groups_are_cached_in_slices_and_passed_slices_go_first(
    lake: ResolvedLake, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bergstream.plugins.ksi_fetch_filter import store as store_module

    monkeypatch.setattr(store_module, "_SLICE_BYTES", 8_000)
    write_cold(
        lake,
        "t",
        [(0, 0, make_record(o, size=200)) for o in range(2000)],
        {0: 2000},
        rows_per_file=2000,
    )
    store = _store(lake, read_ahead_segments=0)
    cold = store.table("t")
    assert cold is not None
    seen = []
    offset = 0
    while (read := cold.read(0, offset)) is not None:
        rows = read.segment.records(read.start, read.stop)
        seen.extend(record for _, record in rows)
        offset = rows[-1][1].offset + 1
        store.done_with(read, offset)
    assert seen == [make_record(o, size=200) for o in range(2000)]
    assert len(store.segments) > 10  # one row group, many slices
    assert store.segments.live_size == 0  # all read: all first in line for eviction
    store.close()


def test_rows_out_of_offset_order_are_sorted_before_slicing(tmp_path: Path) -> None:
    import random

    import pyarrow as pa
    import pyarrow.parquet as pq

    from bergstream.core.typed.row_contract import ROW_ARROW_SCHEMA, record_to_row
    from bergstream.plugins.ksi_fetch_filter.segments import read_row_group_slices

    offsets = list(range(500))
    random.Random(1).shuffle(offsets)
    rows = [record_to_row(0, make_record(o), 0) for o in offsets]
    path = tmp_path / "f.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=ROW_ARROW_SCHEMA), path)
    slices = read_row_group_slices(pq.ParquetFile(path), 0, 0, 2_000)
    assert len(slices) > 1
    assert [int(o) for piece in slices for o in piece.offsets] == list(range(500))
    assert slices[3].records(0, 1)[0][1] == make_record(int(slices[3].offsets[0]))


def test_list_offsets_loads_the_row_groups_a_consumer_fetches_next(lake: ResolvedLake) -> None:
    import time

    from bergstream.plugins.ksi_fetch_filter.planner import OffsetAsk, plan_offsets

    rows = [(p, 0, make_record(o)) for p in (0, 1, 2) for o in range(10, 300)]
    write_cold(lake, "t", rows, {0: 300, 1: 300, 2: 300}, rows_per_file=100)
    store = _store(lake, read_ahead_segments=1)
    answers = plan_offsets(store, [OffsetAsk("t", p, -2) for p in (0, 1)])
    assert {key: a.found for key, a in answers.items()} == {("t", 0): (10, -1), ("t", 1): (10, -1)}
    deadline = time.monotonic() + 10
    while len(store.segments) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    # The first row group of partitions 0 and 1 (not 2: nobody asked) is decoded already.
    loaded = {partition for _, _, partition in store._slice_index}
    assert loaded == {0, 1}, loaded
    store.close()
